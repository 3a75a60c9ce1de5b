"""The load planner in the SGLang backend (kvengine/sglang/planning.py), through SGLang's
cache-controller steps (sglang_fakes.py) over a real store: pages on a slow SSD are not
reported by batch_exists (SGLang computes them), not prefetched, and are written again
when SGLang backs them up; pages on a fast SSD are read, and the reads teach the
planner; bad settings are refused by name."""
import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
import sglang_fakes as fk  # noqa: E402
from test_sglang_backend import PAGE, SMALL, TOKENS, backup, controller, prefetch  # noqa: E402

SSD = dict(ssd_capacity_bytes="64MiB", use_direct_io=False, promote_on_read=False)
SLOW_SSD = {"recompute_tokens_per_s": 1e6,
            "load_planner_options": {"ssd_bytes_per_s": 1e6, "ssd_latency_s": 1e-3}}
FAST_SSD = {"recompute_tokens_per_s": 1e3,
            "load_planner_options": {"ssd_bytes_per_s": 1e12, "ssd_latency_s": 0}}


def on_ssd(db_path, planner):
    """The pages of TOKENS saved, the store closed (its pages on SSD only), and a new
    controller with the planner settings over it."""
    a, ha = controller({"path": db_path}, **SSD)
    _, saved = backup(a, ha, TOKENS)
    a.detach_storage_backend()
    fk.set_parallel(0, 1)
    dev, hb = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    fk.fill_random(hb, 2)
    extra = dict(fk.kvengine_extra_config(path=db_path, **dict(SMALL, **SSD)), **planner)
    return fk.make_controller(dev, hb, extra), hb, saved


def test_slow_ssd_pages_are_left_to_recompute_then_written_again(db_path):
    b, hb, _ = on_ssd(db_path, SLOW_SSD)
    backend = b.storage_backend
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    try:
        assert backend.batch_exists(hashes) == 0
        stats = backend._store.stats()
        assert stats["prefetch_requested"] == 0
        metrics = backend.get_stats()
        assert metrics.hit_pages == 0 and metrics.recompute_pages == 4
        # SGLang computed them and backs them up: written although the store had them,
        # so they are in memory for the next request.
        done, _ = backup(b, hb, TOKENS)
        assert done == 4 * PAGE
        assert backend.get_stats().written_pages == 4
        keys = backend._keys.pages(hashes)
        assert backend._store.batch_locate(keys) == [kvengine.LOCATED_MEMORY] * 4
        assert backend.batch_exists(hashes) == 4
        # Backed up once more: now skipped, as any page the store has.
        backup(b, hb, TOKENS)
        assert backend.get_stats().skipped_writes == 4
    finally:
        b.detach_storage_backend()


def test_fast_ssd_pages_are_read_and_the_reads_teach_the_planner(db_path):
    b, hb, saved = on_ssd(db_path, FAST_SSD)
    try:
        done, got = prefetch(b, hb, TOKENS + [1])
        assert done == 4 * PAGE and got == saved
        planner = b.storage_backend._planner._planner
        assert planner.estimate(kvengine.LOCATED_SSD)["samples"] == 1
    finally:
        b.detach_storage_backend()


def test_memory_pages_are_always_reported(db_path):
    c, host = controller({"path": db_path})
    fk.set_parallel(0, 1)
    dev, hb = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    slow_memory = dict(SLOW_SSD, load_planner_options={"memory_bytes_per_s": 1.0,
                                                       "memory_latency_s": 5.0})
    b = fk.make_controller(dev, hb, dict(fk.kvengine_extra_config(path=db_path, **SMALL),
                                         **slow_memory))
    try:
        backup(c, host, TOKENS)
        hashes = fk.get_hash_str(TOKENS, None, PAGE)
        assert b.storage_backend.batch_exists(hashes) == 4
        assert b.storage_backend.get_stats().recompute_pages == 0
    finally:
        b.detach_storage_backend()
        c.detach_storage_backend()


def test_the_planner_can_be_turned_off(db_path):
    b, hb, saved = on_ssd(db_path, dict(SLOW_SSD, load_planner=False))
    try:
        assert b.storage_backend._planner is None
        assert prefetch(b, hb, TOKENS + [1])[0] == 4 * PAGE
    finally:
        b.detach_storage_backend()


@pytest.mark.parametrize("planner,named", [
    ({"recompute_tokens_per_s": 0}, "recompute_tokens_per_s"),
    ({"recompute_tokens_per_s": "fast"}, "recompute_tokens_per_s"),
    ({"load_planner_options": {"ssd_bytes_per_s": -1}}, "ssd.bytes_per_s"),
    ({"load_planner_options": {"nvme": 1}}, "nvme"),
])
def test_bad_planner_settings_are_refused_by_name(db_path, planner, named):
    fk.set_parallel(0, 1)
    dev, host = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    extra = dict(fk.kvengine_extra_config(path=db_path, **SMALL), **planner)
    with pytest.raises(ValueError, match=named):
        fk.make_controller(dev, host, extra)
