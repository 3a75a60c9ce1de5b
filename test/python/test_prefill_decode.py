"""Prefill/decode disaggregation across hosts through one sharded cluster (docs/vllm.md,
"Prefill/decode across hosts"; docs/sglang.md).  Two hosts, each a network namespace of
its own when the test may make them (fleet.Network; loopback otherwise, and the test
says so), each running a kv_server member of one cluster (etcd on the bridge between
them, or static peers without etcd) and an inference instance of two tensor-parallel
ranks whose processes are spawned on that host and attached to its member:

* vLLM: the prefiller on host A (kv_role "kv_both": it saves, and would load its own
  hits) and the decoder on host B (kv_role "kv_consumer", kv_load_failure_policy
  "recompute"), each a scheduler process and two worker processes;
* SGLang: a prefill instance on host A backs its pages up to HiCache storage, a decode
  instance on host B finds and prefetches them.

The decoder finds the whole prefix and loads it bit-exact.  Then host A goes (its link
cut, so that its member stops answering without resetting connections, and every
process on it killed): with R = 1 the keys A owned are gone, a load already scheduled
fails on them and the decoder recomputes, later lookups stop before them -- and the
decoder's caches end bit-exact either way (0 wrong bytes); with R = 2 every key has a
copy on B and the decoder still gets a full hit, bit-exact."""
import contextlib
import multiprocessing
import os
import warnings

import pytest
import torch

import fleet
import kvengine
import sglang_process as sp
import vllm_fakes as fk
import vllm_process as vp
from spawned import Spawned

pytestmark = [pytest.mark.fleet,
              pytest.mark.skipif(not os.access(fleet.KV_SERVER, os.X_OK),
                                 reason="kv_server is not built")]

BLOCKS = 6
SGLANG = ("mha", "page_first", "bfloat16")
PAGES = 5


@pytest.fixture(params=[1, 2], ids=lambda r: "R%d" % r)
def hosts(request, tmp_path):
    """(cluster, host A's member, host B's member) on two hosts."""
    network = fleet.Network(2)
    if not network.namespaces:
        warnings.warn("the two hosts share loopback, not network namespaces of their own: %s"
                      % network.loopback_why)
    cluster = None
    try:
        cluster = fleet.Cluster(str(tmp_path), network, request.param, bool(fleet.ETCD))
        yield cluster
    finally:
        if cluster is not None:
            cluster.close()
        network.close()


def lose_host(member, processes):
    """Host A goes: cut off the network first (no reset reaches the other host), then
    every process on it killed."""
    member.host.cut()
    for p in processes:
        p.kill()
    member.kill()


def spawn_on(member, *calls):
    """Processes on member's host, started at once: (target, *args) each."""
    return Spawned.all(multiprocessing.get_context("spawn"),
                       *[(fleet.on_host, member.host.netns) + tuple(c) for c in calls])


@contextlib.contextmanager
def prefill_and_decode(cluster, make, *attached_args):
    """The prefill instance on host A and the decode instance on host B: make(member,
    role) spawns one's processes, each of which must be attached to its host's member
    (their "attached" command); all closed after."""
    a, b = cluster.members
    prefill = decode = []
    try:
        prefill = make(a, "prefill")
        decode = make(b, "decode")
        for member, procs in ((a, prefill), (b, decode)):
            assert all(p("attached", *attached_args) == member.socket for p in procs)
            assert all(fleet.host_of(p.process.pid) == member.host.netns for p in procs)
        yield prefill, decode
    finally:
        for p in reversed(prefill + decode):
            p.close()


# ------------------------------------------------------------------ vLLM


def vllm_instance(member, role):
    """A TP-2 instance on member's host attached to it: [scheduler, worker 0, worker 1];
    the prefiller's kv_role is kv_both, the decoder's kv_consumer."""
    store = os.path.join(os.path.dirname(member.socket), "unused")  # attached: no path
    common = (2, role)
    tail = (False, member.socket, "kv_both" if role == "prefill" else "kv_consumer",
            "recompute")
    return spawn_on(member, (vp.main, "scheduler", store) + common + (None,) + tail,
                    *[(vp.main, "worker", store) + common + (r,) + tail for r in range(2)])


def same(a, b):
    return all(torch.equal(x, y) for ra, rb in zip(a, b) for ba, bb in zip(ra, rb)
               for x, y in zip(ba, bb))


def test_vllm_prefill_on_one_host_decode_on_another(hosts):
    cluster = hosts
    a, b = cluster.members
    with prefill_and_decode(cluster, vllm_instance) as (prefiller, decoder):
        p_sched, *p_workers = prefiller
        d_sched, *d_workers = decoder

        none_hash = fk._sha256("0")  # PYTHONHASHSEED=0 on both hosts
        tokens = [(i * 29 + 3) % 32000 for i in range(BLOCKS * vp.BS + 5)]  # 101 tokens
        hashes = fk.block_hashes(tokens, vp.BS, none_hash)
        # The prefiller computes the prompt and saves its blocks.
        ids_p = [4, 1, 7, 3, 9, 5, 6]
        compute = list(zip(ids_p, hashes))
        matched, meta = p_sched("schedule", "p1", tokens, ids_p, none_hash)
        assert matched == 0
        for w in p_workers:
            assert w("step", meta, compute) == []
        want = [w("blocks", ids_p[:BLOCKS]) for w in p_workers]  # [rank][block][layer]
        per_rank = [w("keys", hashes) for w in p_workers]  # block by block, layer by layer
        keys = [k for rank in per_rank for k in rank]
        assert cluster.misplaced(keys) == []
        layers = len(per_rank[0]) // BLOCKS
        # The blocks with a key whose every copy is on host A (R = 1: whose owner is A).
        on_a = {j // layers for rank in per_rank for j, k in enumerate(rank)
                if set(kvengine.rendezvous_owners(k, cluster.endpoints,
                                                  cluster.replicas)) == {a.endpoint}}
        first_owned_by_a = [k for k in keys
                            if kvengine.rendezvous_owners(k, cluster.endpoints, 1)[0] == a.endpoint]
        assert 0 < len(first_owned_by_a) < len(keys)  # both hosts own keys
        assert bool(on_a) == (cluster.replicas == 1)

        def decode(req_id, ids, kill_before_load=False):
            """Schedules the prompt on the decoder and runs its step; blocks that failed
            to load and every block after them are recomputed, as vLLM does under
            "recompute".  Returns (tokens matched, block ids that failed to load)."""
            matched, meta = d_sched("schedule", req_id, tokens, ids, none_hash)
            if kill_before_load:
                lose_host(a, prefiller)
            failed = set()
            for w in d_workers:
                failed |= set(w("step", meta, []))
            loaded = matched // vp.BS
            first_bad = min([ids.index(f) for f in failed], default=loaded)
            redo = list(zip(ids[first_bad:BLOCKS], hashes[first_bad:]))
            if redo:  # the next step computes them
                idle = d_sched("idle")
                for w in d_workers:
                    assert w("step", idle, redo) == []
            assert same([w("blocks", ids[:BLOCKS]) for w in d_workers], want), req_id
            return matched, failed

        # The decoder finds the whole prefix on the other host's member and loads it.
        assert decode("d1", [11, 12, 13, 14, 15, 0, 2]) == (BLOCKS * vp.BS, set())

        # Host A goes after the decoder looked the prompt up, before its workers load.
        ids2 = [8, 10, 11, 12, 13, 14, 15]
        matched, failed = decode("d2", ids2, kill_before_load=True)
        assert matched == BLOCKS * vp.BS  # looked up while host A was there
        assert failed == {ids2[i] for i in on_a}  # recomputed, bit-exact
        # Looked up after: the hit stops before A's first block; the rest is computed.
        matched, failed = decode("d3", [1, 2, 3, 4, 5, 6, 7])
        assert (matched, failed) == (min(on_a, default=BLOCKS) * vp.BS, set())
        # A consumer saves nothing: the blocks it recomputed are still not stored.
        lost = [k for k in keys if set(kvengine.rendezvous_owners(
            k, cluster.endpoints, cluster.replicas)) == {a.endpoint}]
        assert cluster.holders(lost, [b]) == [set()] * len(lost)


# ------------------------------------------------------------------ SGLang


def sglang_instance(member, role):
    """A TP-2 SGLang instance on member's host: a process per rank, attached to it."""
    return spawn_on(member, *[(sp.main, {"attach": member.socket}, r, 2) for r in range(2)])


def test_sglang_prefill_on_one_host_decode_on_another(hosts):
    cluster = hosts
    a, b = cluster.members
    with prefill_and_decode(cluster, sglang_instance, SGLANG) as (prefill, decode):
        tokens = [(i * 37 + 11) % 32000 for i in range(PAGES * sp.PAGE + 3)]
        saved = [r("backup", SGLANG, tokens, list(range(PAGES)), 3) for r in prefill]
        assert [t for t, _ in saved] == [PAGES * sp.PAGE] * 2
        assert saved[0][1] != saved[1][1]  # the ranks' bytes differ: a mix-up shows
        per_rank = [r("keys", SGLANG, tokens, list(range(PAGES))) for r in prefill]
        assert cluster.misplaced([k for rank in per_rank for k in rank]) == []

        def hit():  # SGLang all-reduces the ranks' hits with min
            return min(r("hit", SGLANG, tokens) for r in decode)

        def load(n):
            """Prefetches n tokens on every decode rank; the pages it reports loaded must
            be the prefill rank's, bit-exact (the rest SGLang computes)."""
            done = []
            for rank, r in enumerate(decode):
                loaded, digests = r("load", SGLANG, tokens, n, 2)
                pages = loaded // sp.PAGE
                assert digests[:pages] == saved[rank][1][:pages], "rank %d" % rank
                done.append(loaded)
            return done

        assert hit() == PAGES * sp.PAGE
        assert load(PAGES * sp.PAGE) == [PAGES * sp.PAGE] * 2

        # Host A goes.  With R = 1 its pages are gone: each rank's hit and prefetch stop
        # before its first page on A (SGLang computes the rest); with R = 2 B has them.
        pages_on_a = [min([p for p, k in enumerate(rank)
                           if set(kvengine.rendezvous_owners(k, cluster.endpoints,
                                                             cluster.replicas)) == {a.endpoint}],
                          default=PAGES) * sp.PAGE for rank in per_rank]
        lose_host(a, prefill)
        assert hit() == min(pages_on_a)
        assert load(PAGES * sp.PAGE) == pages_on_a
