"""kvengine as SGLang's HiCache storage across real processes (docs/sglang.md): two
SGLang instances of two tensor-parallel ranks each, every rank a spawned process with
SGLang's cache controller (the stand-in) and its own backend, all sharing one store:
the first rank process to open the path owns it and the others attach.  Pages backed up
by one instance's ranks are found (hits all-reduced with min, as SGLang's prefetch
thread does) and prefetched bit-exact into the other instance's host pools at other
indices, in every layout, MHA and MLA, bf16, fp16 and fp8; then the owner goes away, by
a clean exit or a kill, and no other rank loses the store."""
import multiprocessing

import pytest

pytest.importorskip("torch", reason="torch is not installed (Debian: apt-get install "
                                    "python3-torch)")

import sglang_hybrid as sh  # noqa: E402
import sglang_process as sp  # noqa: E402
from spawned import Spawned

KINDS_LAYOUTS = [(k, l) for k in ("mha", "mla")
                 for l in ("layer_first", "page_first", "page_first_direct")]
DTYPES = ["bfloat16", "float16", "float8_e4m3fn"]
TOKENS = [(i * 31 + 7) % 32000 for i in range(5 * sp.PAGE + 3)]  # 5 whole pages


class Instance:
    """A tensor-parallel-2 SGLang instance: rank processes 0 and 1."""

    def __init__(self, ctx, store):
        self.ranks = [Spawned(ctx, sp.main, store, r, 2) for r in range(2)]

    def all(self, command, *args):
        return [r(command, *args) for r in self.ranks]

    def hit(self, config, tokens):
        """The hit count every rank agrees on (SGLang all-reduces it with min)."""
        return min(self.all("hit", config, tokens))

    def close(self):
        for r in self.ranks:
            r.close()


@pytest.fixture
def instances(db_path):
    ctx = multiprocessing.get_context("spawn")
    made = []

    def make():
        made.append(Instance(ctx, {"path": db_path}))
        return made[-1]

    yield make
    for inst in made:
        inst.close()


def test_two_instances_of_two_ranks_share_pages_bit_exact(instances):
    a = instances()
    b = instances()
    assert a.ranks[0]("attached", ("mha", "page_first", "bfloat16")) is None  # the owner
    for r in a.ranks[1:] + b.ranks:
        assert r("attached", ("mha", "page_first", "bfloat16"))  # attached to it
    for kind, layout in KINDS_LAYOUTS:
        for dtype in DTYPES:
            config = (kind, layout, dtype)
            where = "%s %s %s" % config
            saved = a.all("backup", config, TOKENS, list(range(5)), 1)
            assert [t for t, _ in saved] == [5 * sp.PAGE, 5 * sp.PAGE if kind == "mha" else 0]
            assert b.hit(config, TOKENS) == 5 * sp.PAGE, where
            loaded = b.all("load", config, TOKENS, 5 * sp.PAGE, 3)
            for rank in range(2):
                assert loaded[rank][0] == 5 * sp.PAGE, where
                # MHA: each rank reads its own heads; MLA: rank 0's pages, on every rank.
                writer = rank if kind == "mha" else 0
                assert loaded[rank][1] == saved[writer][1], "%s rank %d" % (where, rank)
            assert saved[0][1] != saved[1][1]  # the ranks' bytes differ: a mix-up shows
            # MLA single writer: rank 1 wrote nothing.
            stats = a.all("stats", config)
            assert stats[0]["written_pages"] == 5
            assert stats[1]["written_pages"] == (5 if kind == "mha" else 0)
            # Written once: a second backup finds every page stored.
            again = a.all("backup", config, TOKENS, list(range(5)), 1)
            assert again[0][0] == 5 * sp.PAGE
            assert a.ranks[0]("stats", config)["skipped_writes"] == 5


    # Leading hits stop at a hole on either rank: rank 1 lacks page 2 of this prompt.
    config = ("mha", "page_first", "bfloat16")
    tokens = [t + 1 for t in TOKENS]
    a.ranks[0]("backup", config, tokens, [0, 1, 2, 3, 4], 2)
    a.ranks[1]("backup", config, tokens, [0, 1, 3, 4], 2)
    assert a.all("hit", config, tokens) == [5 * sp.PAGE, 2 * sp.PAGE]
    assert b.hit(config, tokens) == 2 * sp.PAGE
    loaded = b.all("load", config, tokens, 2 * sp.PAGE, 1)
    assert [t for t, _ in loaded] == [2 * sp.PAGE, 2 * sp.PAGE]


def the_only_owner(ranks, config):
    owners = [r for r in ranks if r("attached", config) is None]
    assert len(owners) == 1, "%d owners" % len(owners)  # the others are attached to it
    return owners[0]


def test_no_rank_loses_the_store_when_its_owner_goes(instances):
    """The owning rank exits first, cleanly (its store is flushed to SSD); then the rank
    that took the store over is killed (nothing flushed).  After each, every rank left
    still backs up and prefetches, one of them owning the store and the rest attached."""
    a = instances()
    b = instances()
    mla, mha = ("mla", "page_first", "bfloat16"), ("mha", "page_first", "bfloat16")
    saved = a.ranks[0]("backup", mla, TOKENS, list(range(5)), 4)
    for r in a.ranks + b.ranks:  # every rank has both configurations open
        r("hit", mla, TOKENS)
        r("hit", mha, TOKENS)
    a.ranks[0].close()
    assert b.hit(mla, TOKENS) == 5 * sp.PAGE  # flushed at close: the new owner has them
    loaded = b.all("load", mla, TOKENS, 5 * sp.PAGE, 2)
    assert [d for _, d in loaded] == [saved[1], saved[1]]
    survivors = [a.ranks[1]] + b.ranks
    owner = the_only_owner(survivors, mla)
    owner.kill()
    survivors.remove(owner)
    for i, r in enumerate(survivors):  # each rank left writes and reads its own pages
        tokens = [t + 10 + i for t in TOKENS]
        saved = r("backup", mha, tokens, list(range(5)), 5)
        assert saved[0] == 5 * sp.PAGE
        assert r("hit", mha, tokens) == 5 * sp.PAGE
        assert list(r("load", mha, tokens, 5 * sp.PAGE, 1)) == [5 * sp.PAGE, saved[1]]
    the_only_owner(survivors, mha)


HYBRID_SMALL = dict(memory_capacity_bytes="16MiB", ssd_capacity_bytes=0, prefault_memory=False,
                    apply_environment=False)


@pytest.mark.parametrize("kind", ["mamba", "swa", "dsa"])
def test_hybrid_pools_across_attached_processes(instances, kind):
    """Hybrid models (SGLang's v2 interface) across rank processes: instance a backs up
    a prompt's KV and side pool pages, instance b (attached to the same store) finds them
    through batch_exists_v2 and reads them bit-exact.  Then eviction pressure from
    another process between b's hit query and its read: every page b reports loaded is
    whole (its KV and side page those a wrote), and a page it does not is untouched --
    never a KV page beside a missing or stale indexer page."""
    a = instances()
    b = instances()
    saved = a.all("hybrid_backup", kind, 1, HYBRID_SMALL)
    mla = kind == "dsa"
    # MLA (DSA): rank 0 writes the KV and indexer groups; rank 1 skips its backup.
    assert [t for t, _, _ in saved] == [sh.PAGES * sh.PAGE, 0 if mla else sh.PAGES * sh.PAGE]
    hits = min(b.all("hybrid_hit", kind))
    assert hits == sh.PAGES
    loaded = b.all("hybrid_read", kind, hits)
    for rank in range(2):
        writer = 0 if mla else rank
        tokens, kv, side, untouched = loaded[rank]
        assert tokens == sh.PAGES * sh.PAGE, (kind, rank)
        assert kv == saved[writer][1], (kind, rank)
        if not mla:
            assert side == saved[writer][2] and side, (kind, rank)
    if not mla:
        return
    # Eviction pressure from a rank of instance a between b's hit query and its read.
    assert min(b.all("hybrid_hit", kind)) == sh.PAGES
    assert a.ranks[0]("flood", kind) > 0
    loaded = b.all("hybrid_read", kind, sh.PAGES)
    for rank in range(2):
        tokens, kv, side, rest = loaded[rank]
        assert tokens < sh.PAGES * sh.PAGE, rank  # the first page's group is gone
        for h, d in kv.items():
            assert saved[0][1][h] == d and saved[0][2][h] == side[h], rank
        # A page not counted loaded (SGLang stops at the first miss; the engine may have
        # read later pages whole) holds both halves of one group, or neither.
        for h, kv_digest, side_digest, kv_zero, side_zero in rest:
            assert kv_zero == side_zero, (rank, h)
            if not kv_zero:
                assert (kv_digest, side_digest) == (saved[0][1][h], saved[0][2][h]), (rank, h)
