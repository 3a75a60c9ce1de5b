"""The load planner in the vLLM connector (kvengine/vllm/planner.py): a slow tier's hits
are left to vLLM to recompute -- not loaded, not prefetched -- and the request account
says why; memory hits are always loaded; the workers' measured loads reach the planner
through vLLM's connector output; bad settings are refused by name.  Also
kvengine.LoadPlanner itself, as Python sees it."""
import json
import logging
import time

import pytest

import kvengine
from kvengine.load_planning import planner_kwargs

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

from test_vllm_account import BS, Instance, hash_seed, lines, tokens  # noqa: E402,F401
import vllm_fakes as fk  # noqa: E402
from vllm_fakes import block_hashes  # noqa: E402

# A prefill rate and an SSD the planner must refuse: 1 MB/s against 1e6 tokens/s.
SLOW_SSD = {"recompute_tokens_per_s": 1e6,
            "load_planner_options": {"ssd_bytes_per_s": 1e6, "ssd_latency_s": 1e-3}}
FAST_SSD = {"recompute_tokens_per_s": 1e3,
            "load_planner_options": {"ssd_bytes_per_s": 1e12, "ssd_latency_s": 0}}


def push_to_ssd(inst, prompt):
    """Runs the prompt once (its blocks saved), then other traffic pushes them from memory
    to SSD; returns the blocks' hashes."""
    assert inst.run("r-first", prompt, [1, 2, 3, 4, 5])[0] == 0
    inst.fill(200)
    assert inst.db.flush() == 0
    _, req = inst.run("r-probe", tokens(BS + 1, seed=5), [11, 12])
    return req


def located(inst, prompt):
    hashes = block_hashes(prompt, BS, inst.none_hash)
    return [inst.db.batch_locate([inst.key(h, layer) for layer in range(3)]) for h in hashes]


def stat(inst, name):
    text = inst.db.get_property("kvengine.stats")
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return int(value)
    raise AssertionError("%s not in kvengine.stats:\n%s" % (name, text))


def test_slow_ssd_hits_are_left_to_recompute_and_the_account_says_why(db_path, tmp_path):
    log = str(tmp_path / "requests.jsonl")
    inst = Instance(db_path, log, extra=SLOW_SSD, ssd_capacity_bytes="8MiB",
                    bucket_size_limit="256KiB")
    try:
        prompt = tokens(4 * BS + 1)
        push_to_ssd(inst, prompt)
        assert all(tiers == [2, 2, 2] for tiers in located(inst, prompt))
        ssd_hits, prefetches = stat(inst, "ssd.hits"), stat(inst, "prefetch_requested")
        loaded = inst.worker.num_loaded_blocks
        assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 0
        # Nothing was read from SSD: neither loaded nor prefetched.
        assert stat(inst, "ssd.hits") == ssd_hits
        assert stat(inst, "prefetch_requested") == prefetches
        assert inst.worker.num_loaded_blocks == loaded
        # vLLM computed them, and they were saved again: back in memory, without an
        # SSD read, for the next request.
        assert [max(t) for t in located(inst, prompt)] == [1, 1, 1, 1]
        assert inst.run("r-again", prompt, [1, 2, 3, 4, 5])[0] == 4 * BS
        # Pushed to SSD once more.
        inst.fill(200, start=200)
        assert inst.db.flush() == 0
        assert [max(t) for t in located(inst, prompt)] == [2, 2, 2, 2]
        # Two blocks brought back into memory: those two are loaded, the SSD rest not.
        for h in block_hashes(prompt, BS, inst.none_hash)[:2]:
            for layer in range(3):
                key = inst.key(h, layer)
                assert inst.db.put(key, bytes(inst.db.get(key))) == 0
        assert [max(t) for t in located(inst, prompt)] == [1, 1, 2, 2]
        assert inst.run("r-mixed", prompt, [1, 2, 3, 4, 5])[0] == 2 * BS
    finally:
        inst.close()
    got = lines(log)
    ssd = got["r-ssd"]
    assert ssd["tokens_hit"] == 0 and ssd["blocks_loaded"] == 0
    assert [m["reason"] for m in ssd["missed"]] == ["slower_than_recompute"] * 4
    estimate = ssd["missed"][0]["estimate"]
    assert estimate["tiers"] == ["ssd"]
    assert estimate["load_ms"] > estimate["recompute_ms"] > 0
    assert estimate["ttft_ms"] < estimate["ttft_ms_loading_all"]
    mixed = got["r-mixed"]
    assert mixed["tokens_hit_by_tier"] == {"memory": 2 * BS} and mixed["blocks_loaded"] == 2
    assert [m["reason"] for m in mixed["missed"]] == ["slower_than_recompute"] * 2
    assert json.dumps(mixed)  # one JSON line


def test_memory_hits_are_never_refused(db_path, tmp_path):
    extra = dict(SLOW_SSD, load_planner_options={"memory_bytes_per_s": 1.0,
                                                 "memory_latency_s": 5.0})
    inst = Instance(db_path, str(tmp_path / "a.jsonl"), extra=extra)
    try:
        prompt = tokens(4 * BS + 1, seed=2)
        assert inst.run("r1", prompt, [1, 2, 3, 4, 5])[0] == 0
        assert inst.run("r2", prompt, [6, 7, 8, 9, 10])[0] == 4 * BS
    finally:
        inst.close()


def test_fast_ssd_hits_are_loaded_and_the_loads_teach_the_planner(db_path, tmp_path):
    inst = Instance(db_path, None, extra=FAST_SSD, ssd_capacity_bytes="8MiB",
                    bucket_size_limit="256KiB")
    try:
        prompt = tokens(4 * BS + 1, seed=4)
        push_to_ssd(inst, prompt)
        assert inst.sched.connector_scheduler._planner._planner is None  # no hit planned yet
        assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 4 * BS
        # The worker's measured load came back with vLLM's connector output.
        planner = inst.sched.connector_scheduler._planner._planner
        assert planner.estimate(kvengine.LOCATED_SSD)["samples"] == 1
        assert planner.estimate(kvengine.LOCATED_MEMORY)["samples"] == 0
    finally:
        inst.close()


def test_an_unknown_prefill_rate_loads_every_hit_and_says_so_once(db_path, tmp_path, caplog):
    extra = {"load_planner_options": {"ssd_bytes_per_s": 1.0}}
    inst = Instance(db_path, None, extra=extra, ssd_capacity_bytes="8MiB",
                    bucket_size_limit="256KiB")
    # A worker that times no step (with pipeline stages, say): nothing teaches the rate.
    inst.worker.connector_worker._step_timer = None
    try:
        prompt = tokens(4 * BS + 1, seed=6)
        with caplog.at_level(logging.WARNING, logger="kvengine"):
            push_to_ssd(inst, prompt)
            assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 4 * BS
            assert inst.run("r-again", prompt, [1, 2, 3, 4, 5])[0] == 4 * BS
    finally:
        inst.close()
    notices = [r for r in caplog.records if "recompute_tokens_per_s" in r.getMessage()]
    assert len(notices) == 1


def test_a_prefill_rate_learned_from_the_workers_steps_cuts_a_slow_tier(db_path, tmp_path,
                                                                      monkeypatch):
    """No rate configured: the worker times each forward step the scheduler side marked
    (step_tokens), the stats carry [tokens, seconds] back through vLLM's connector
    output, and the planner's rate is fitted to them; then a slow SSD's hits are left to
    recompute, the account saying so with the learned rate."""
    rate = 2000.0  # tokens/s of the fake forward: each computed block sleeps BS / rate
    fill = fk.fill_block

    def slow_fill(caches, layout, block_id, block_hash):
        time.sleep(BS / rate)
        fill(caches, layout, block_id, block_hash)

    monkeypatch.setattr(fk, "fill_block", slow_fill)
    log = str(tmp_path / "requests.jsonl")
    # An SSD at 100 kB/s: a block's 3 layers read in about 60 ms, against 8 ms to compute.
    slow = {"load_planner_options": {"ssd_bytes_per_s": 1e5, "ssd_latency_s": 1e-3}}
    inst = Instance(db_path, log, extra=slow, ssd_capacity_bytes="8MiB",
                    bucket_size_limit="256KiB")
    try:
        side = inst.sched.connector_scheduler._planner
        assert side.learns_rate
        for i, blocks in enumerate((1, 4, 2, 6, 3, 5, 1, 6)):  # misses: no loads, timed
            prompt = tokens(blocks * BS + 1, seed=100 + i)
            assert inst.run("r-learn-%d" % i, prompt, list(range(1, blocks + 2)))[0] == 0
        assert side._planner is None and len(side._early_steps) >= 8
        prompt = tokens(4 * BS + 1, seed=9)
        push_to_ssd(inst, prompt)
        assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 0
        learned = side._planner.recompute_tokens_per_s
        assert rate / 2 < learned < rate * 1.5, learned  # a loaded host sleeps longer
    finally:
        inst.close()
    got = lines(log)["r-ssd"]
    assert got["tokens_hit"] == 0
    assert [m["reason"] for m in got["missed"]] == ["slower_than_recompute"] * 4
    estimate = got["missed"][0]["estimate"]
    assert estimate["rate"] == "learned" and estimate["tiers"] == ["ssd"]
    assert rate / 2 < estimate["recompute_tokens_per_s"] < rate * 1.5
    assert estimate["load_ms"] > estimate["recompute_ms"] > 0


def test_steps_are_timed_only_to_learn_the_rate(db_path):
    """A configured rate: no step is marked; a step that loads is never timed."""
    from kvengine.vllm.common import KVEngineConnectorMetadata
    from kvengine.vllm.planner import StepTimer, prefill_step_tokens

    inst = Instance(db_path, None, extra=SLOW_SSD)
    try:
        assert not inst.sched.connector_scheduler._planner.learns_rate
        req = fk.Request("r", tokens(2 * BS + 1), BS, inst.none_hash)
        inst.sched.get_num_new_matched_tokens(req, 0)
        inst.sched.update_state_after_alloc(req, fk.KVCacheBlocks([1, 2, 3]), 0)
        step = fk.new_step(new=[(req, [1, 2, 3], 0, 2 * BS + 1)])
        assert inst.sched.build_connector_meta(step).step_tokens == 0
        assert prefill_step_tokens(step) == 2 * BS + 1
    finally:
        inst.close()
    decodes = fk.cached_step(["a", "b"], [None, None], [40, 50], [1, 1])
    assert prefill_step_tokens(decodes) == 0
    decodes.scheduled_spec_decode_tokens = {"a": [7, 8]}
    decodes.num_scheduled_tokens = {"a": 3, "b": 1}
    assert prefill_step_tokens(decodes) == 0  # speculative tokens are decodes
    samples = []
    timer = StepTimer(lambda **kw: samples.append(kw["step_samples"]))
    timer.start(KVEngineConnectorMetadata(step_tokens=64, loads=["a load"]), False)
    timer.stop()
    timer.start(KVEngineConnectorMetadata(step_tokens=0), False)
    timer.stop()
    assert samples == []
    timer.start(KVEngineConnectorMetadata(step_tokens=64), False)
    timer.stop()
    assert len(samples) == 1 and samples[0][0] == 64 and samples[0][1] > 0


def test_the_prefill_rate_fit_converges_to_the_steps_rate():
    """record_prefill: steps of overhead + tokens / rate teach the rate, the overhead
    apart; the first step alone already gives one."""
    p = kvengine.LoadPlanner()
    assert p.recompute_tokens_per_s is None
    sizes = [512, 4096, 1024, 8192, 2048, 6144, 256, 3072]
    for i in range(60):
        tokens_ = sizes[i % len(sizes)]
        p.record_prefill(tokens_, 0.004 + tokens_ / 40000.0)
        if i == 0:
            assert p.recompute_tokens_per_s is not None
    assert p.recompute_tokens_per_s == pytest.approx(40000.0, rel=0.05)
    with pytest.raises(ValueError):
        p.record_prefill(0, 1.0)


def test_the_planner_can_be_turned_off(db_path):
    inst = Instance(db_path, None, extra=dict(SLOW_SSD, load_planner=False),
                    ssd_capacity_bytes="8MiB", bucket_size_limit="256KiB")
    try:
        prompt = tokens(4 * BS + 1, seed=8)
        push_to_ssd(inst, prompt)
        assert inst.sched.connector_scheduler._planner is None
        assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 4 * BS
    finally:
        inst.close()


@pytest.mark.parametrize("extra,named", [
    ({"recompute_tokens_per_s": 0}, "recompute_tokens_per_s"),
    ({"recompute_tokens_per_s": -3}, "recompute_tokens_per_s"),
    ({"recompute_tokens_per_s": "fast"}, "recompute_tokens_per_s"),
    ({"recompute_tokens_per_s": 1e15}, "recompute_tokens_per_s"),
    ({"load_planner_options": {"ssd_bytes_per_s": 0}}, "ssd.bytes_per_s"),
    ({"load_planner_options": {"peer_latency_s": -1}}, "peer.latency_s"),
    ({"load_planner_options": {"disk_speed": 1}}, "disk_speed"),
    ({"load_planner_options": [1]}, "load_planner_options"),
])
def test_bad_planner_settings_are_refused_by_name(db_path, extra, named):
    with pytest.raises(ValueError, match=named):
        Instance(db_path, None, extra=extra)


def test_load_planner_binding():
    p = kvengine.LoadPlanner(recompute_tokens_per_s=250000.0, ssd_bytes_per_s=0.83e9)
    tiers = [1] * 4 + [2] * 4  # 2 blocks of 4 keys: memory, then SSD
    plan = p.plan(tiers, keys_per_block=4, key_bytes=1572864, block_tokens=512)
    assert plan["hit_blocks"] == 2 and plan["load_blocks"] == 1 and plan["rate_known"]
    assert plan["all_hits_load_s"] > plan["all_hits_recompute_s"]
    assert p.recompute_tokens_per_s == pytest.approx(250000.0)
    p.record_load(0, 6 << 20, 0, 0.001)  # 6 MiB in 1 ms: a fast SSD now
    assert p.estimate(kvengine.LOCATED_SSD)["samples"] == 1
    p.add_in_flight(kvengine.LOCATED_SSD, 1 << 30)
    assert kvengine.LoadPlanner().recompute_tokens_per_s is None
    for bad in (dict(recompute_tokens_per_s=0.0), dict(ssd_bytes_per_s=-1.0),
                dict(overlap_layers=0), dict(estimate_weight=2.0)):
        with pytest.raises(ValueError, match=list(bad)[0].replace("ssd_", "ssd.")):
            kvengine.LoadPlanner(**bad)
    with pytest.raises(ValueError, match="whole number of blocks"):
        p.plan([1, 1, 1], keys_per_block=2, key_bytes=1, block_tokens=16)
    with pytest.raises(ValueError, match="tier"):
        p.plan([0], keys_per_block=1, key_bytes=1, block_tokens=16)
    with pytest.raises(ValueError, match="seconds"):
        p.record_load(0, 10, 0, 0.0)
    with pytest.raises(ValueError):
        p.add_in_flight(7, 10)


def test_a_stated_figure_is_trusted_and_a_nominal_one_priced_cautiously():
    # 2 blocks on an SSD at 4 GB/s: 1.57 ms per 6 MiB block against 2.05 ms of compute.
    # The figure as the nominal guess (samples 0): priced at up to 4x until loads have
    # measured it, so the hits are recomputed; stated as measured, they are loaded.
    tiers = [2] * 8
    args = dict(keys_per_block=4, key_bytes=1572864, block_tokens=512)
    guess = kvengine.LoadPlanner(recompute_tokens_per_s=250000.0, ssd_bytes_per_s=4e9)
    assert guess.plan(tiers, **args)["load_blocks"] == 0
    trusted = kvengine.LoadPlanner(recompute_tokens_per_s=250000.0, ssd_bytes_per_s=4e9,
                                   ssd_samples=kvengine.LoadPlanner.TRUSTED_LOADS)
    assert trusted.plan(tiers, **args)["load_blocks"] == 2
    # An integration's settings state a deployment's own figures: trusted.
    kwargs = planner_kwargs({"recompute_tokens_per_s": 250000,
                             "load_planner_options": {"ssd_bytes_per_s": 4e9}}, "extra")
    assert kwargs["ssd_samples"] == kvengine.LoadPlanner.TRUSTED_LOADS
    assert "peer_samples" not in kwargs
    assert kvengine.LoadPlanner(**kwargs).plan(tiers, **args)["load_blocks"] == 2
