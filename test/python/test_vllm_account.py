"""The per-request account (kvengine/vllm/account.py): each case made to happen -- a hit
in memory, a hit on SSD, a block absent, a block evicted (for room, or deleted), a block
present but unreadable -- and the request's JSON line checked; the option's defaults and
sampling; kv_ldb explain over the file."""
import glob
import json
import os
import subprocess

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

from kvengine.vllm._vllm_compat import KVConnectorRole  # noqa: E402
from kvengine.vllm.account import sampled  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector  # noqa: E402
import vllm_fakes as fk  # noqa: E402

BS = 16
LAYOUT = "flash_nhd"
VALUE = 4 * 2 * 8 * BS * 2  # one block of one layer (fp16)


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


class Instance:
    def __init__(self, path, account, sample=None, extra=None, **options):
        opts = dict(memory_capacity_bytes="256KiB", memory_slab_size="64KiB",
                    prefault_memory=False, apply_environment=False, gc_interval_ms=0,
                    promote_on_read=False)
        opts.update(options)
        extra = dict(extra or {}, options=opts, engine_id="E", request_account=account)
        if sample is not None:
            extra["request_account_sample"] = sample
        cfg = fk.make_config(path, block_size=BS, policy="recompute", **extra)
        self.none_hash = fk.init_none_hash()
        self.sched = KVEngineConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = KVEngineConnector(cfg, KVConnectorRole.WORKER)
        self.caches = fk.make_caches(LAYOUT, block_size=BS)
        self.worker.register_kv_caches(self.caches)
        self.db = self.sched._db

    def run(self, req_id, tokens, ids):
        """Schedules a new request, runs its step (computing what missed), then finishes
        it, the workers' output of each step handed back to the scheduler side as vLLM
        hands it; returns the matched tokens and the request."""
        req = fk.Request(req_id, tokens, BS, self.none_hash)
        matched, _ = self.sched.get_num_new_matched_tokens(req, 0)
        self.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), matched)
        meta = self.sched.build_connector_meta(
            fk.new_step(new=[(req, ids, matched, req.num_tokens - matched)]))
        compute = [(ids[i], h) for i, h in enumerate(req.block_hashes) if i * BS >= matched]
        self.step(meta, compute)
        self.sched.request_finished(req, ids)
        self.step(self.sched.build_connector_meta(fk.new_step(finished=[req_id])))
        return matched, req

    def step(self, meta, compute=()):
        fk.run_worker_step(self.worker, meta, self.caches, LAYOUT, compute, keep_bound=True)
        out = fk.KVOutputAggregator(1).aggregate([fk.worker_output(self.worker)])
        self.worker.clear_connector_metadata()
        self.sched.update_connector_output(out.kv_connector_output)

    def key(self, h, layer):
        return self.worker.block_key(bytes(h).hex(), layer)

    def fill(self, n, start=0):
        for i in range(start, start + n):
            assert self.db.put("other/%d" % i, bytes(VALUE)) == 0

    def close(self):
        self.sched.shutdown()
        self.worker.shutdown()


def lines(path):
    with open(path) as f:
        return {a["request_id"]: a for a in map(json.loads, f)}


def tokens(n, seed=0):
    return [(seed * 7919 + i * 31) % 32000 for i in range(n)]


def corrupt_on_disk(db_dir, value):
    """Flips a byte of `value` in the bucket file that holds it."""
    for path in glob.glob(os.path.join(db_dir, "bucket-*.kvb")):
        data = bytearray(open(path, "rb").read())
        at = data.find(value)
        if at >= 0:
            with open(path, "r+b") as f:
                f.seek(at + 100)
                f.write(bytes([data[at + 100] ^ 0xFF]))
            return path
    raise AssertionError("value not found in any bucket")


def test_each_hit_and_miss_case_is_accounted(db_path, tmp_path):
    log = str(tmp_path / "requests.jsonl")
    # A prefill rate stated slow enough that every SSD hit beats recomputing it: this test
    # is about the account's cases, and a rate learned from the stand-in's instant forward
    # would have the planner (rightly) leave an unmeasured SSD's hits to recompute.
    inst = Instance(db_path, log, extra={"recompute_tokens_per_s": 1e3},
                    ssd_capacity_bytes="8MiB", bucket_size_limit="256KiB")
    try:
        prompt = tokens(4 * BS + 1)
        assert inst.run("r-absent", prompt, [1, 2, 3, 4, 5])[0] == 0
        assert inst.run("r-memory", prompt, [6, 7, 8, 9, 10])[0] == 4 * BS
        # Other traffic pushes the blocks out of memory onto SSD; one block's layer 1 is
        # then deleted, and block 1's layer 0 is damaged on disk.
        inst.fill(200)
        assert inst.db.flush() == 0
        _, req = inst.run("r-probe", tokens(BS + 1, seed=5), [11, 12])
        hashes = fk.block_hashes(prompt, BS, inst.none_hash)
        assert inst.db.batch_locate([inst.key(h, 0) for h in hashes]) == [2, 2, 2, 2]
        assert inst.db.remove(inst.key(hashes[3], 1)) == 0
        corrupt_on_disk(db_path, bytes(inst.db.get(inst.key(hashes[1], 0))))
        assert inst.run("r-ssd", prompt, [1, 2, 3, 4, 5])[0] == 3 * BS
    finally:
        inst.close()
    got = lines(log)
    absent = got["r-absent"]
    assert absent["tokens_asked"] == 4 * BS + 1 and absent["tokens_hit"] == 0
    assert [m["reason"] for m in absent["missed"]] == ["absent"] * 4
    assert absent["blocks_saved"] == 4 and absent["save_ms"] > 0
    assert absent["blocks_loaded"] == 0 and "load_ms" not in absent

    memory = got["r-memory"]
    assert memory["tokens_hit"] == 4 * BS and memory["tokens_hit_by_tier"] == {"memory": 4 * BS}
    assert memory["missed"] == [] and memory["blocks_loaded"] == 4
    assert memory["bytes_loaded"] == 4 * 3 * VALUE
    load = memory["load_ms"]
    assert len(load["per_layer"]) == 3 and 0 < load["first_layer"] <= load["last_layer"]

    ssd = got["r-ssd"]
    assert ssd["tokens_hit_by_tier"] == {"ssd": 3 * BS}
    assert ssd["blocks_loaded"] == 2  # block 1 failed to load
    missed = {m["block"]: m for m in ssd["missed"]}
    assert missed[1]["reason"] == "unreadable" and missed[1]["error"] == "corruption"
    assert missed[1]["stage"] == "load"
    assert missed[3]["reason"] == "evicted" and missed[3]["by"] == "deleted"
    assert missed[3]["tier"] == "ssd" and missed[3]["at"] > absent["time"] * 1e6
    assert sorted(missed) == [1, 3]


def test_eviction_for_room_is_accounted_with_its_time_and_tier(db_path, tmp_path):
    log = str(tmp_path / "requests.jsonl")
    inst = Instance(db_path, log, ssd_capacity_bytes=0)  # an evicted value is gone
    try:
        prompt = tokens(2 * BS + 1, seed=3)
        inst.run("r1", prompt, [1, 2, 3])
        inst.fill(200)
        assert inst.run("r2", prompt, [4, 5, 6])[0] == 0
    finally:
        inst.close()
    missed = lines(log)["r2"]["missed"]
    assert [m["reason"] for m in missed] == ["evicted", "evicted"]
    assert all(m["by"] == "capacity" and m["tier"] == "memory" for m in missed)


def test_account_is_off_by_default_and_sampled_by_request_id(db_path, tmp_path):
    inst = Instance(db_path, None)
    try:
        inst.run("r1", tokens(BS + 1), [1, 2])
        assert inst.worker.connector_worker._accounts is None
    finally:
        inst.close()
    log = str(tmp_path / "sampled.jsonl")
    inst = Instance(db_path, log, sample=0.5)
    ids = ["req-%d" % i for i in range(16)]
    try:
        for i, r in enumerate(ids):
            inst.run(r, tokens(BS + 1, seed=100 + i), [1, 2])
    finally:
        inst.close()
    assert sorted(lines(log)) == sorted(r for r in ids if sampled(r, 0.5))
    assert 0 < len(lines(log)) < len(ids)
    with pytest.raises(ValueError, match="request_account_sample"):
        Instance(db_path, log, sample=1.5)


def test_kv_ldb_explain_summarises_an_account_file(tmp_path):
    kv_ldb = os.environ.get("KV_LDB") or os.path.join(
        os.path.dirname(os.environ["PYTHONPATH"].split(os.pathsep)[0]), "kv_ldb")
    if not os.path.exists(kv_ldb):
        pytest.skip("kv_ldb is not built next to the Python package (%s)" % kv_ldb)
    log = tmp_path / "requests.jsonl"
    rows = [
        {"request_id": "a", "tokens_asked": 64, "tokens_hit": 48,
         "tokens_hit_by_tier": {"memory": 32, "ssd": 16}, "blocks_loaded": 3,
         "bytes_loaded": 3000, "load_ms": {"first_layer": 1.0, "last_layer": 9.5},
         "save_ms": 2.0, "missed": [{"block": 3, "reason": "evicted", "by": "capacity",
                                     "tier": "memory", "at": 1}]},
        {"request_id": "b", "tokens_asked": 64, "tokens_hit": 0, "tokens_hit_by_tier": {},
         "blocks_loaded": 0, "bytes_loaded": 0, "save_ms": 4.0,
         "missed": [{"block": i, "reason": "absent"} for i in range(4)]},
        {"request_id": "c", "tokens_asked": 32, "tokens_hit": 16,
         "tokens_hit_by_tier": {"ssd": 16}, "blocks_loaded": 0, "bytes_loaded": 0,
         "load_ms": {"first_layer": 30.0, "last_layer": 42.0}, "save_ms": 0,
         "missed": [{"block": 0, "reason": "unreadable", "error": "corruption",
                     "stage": "load"},
                    {"block": 1, "reason": "slower_than_recompute",
                     "estimate": {"load_ms": 9.0, "recompute_ms": 2.0, "tiers": ["ssd"]}}]},
    ]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    out = subprocess.run([kv_ldb, "explain", "--log=%s" % log], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "requests: 3" in text and "skipped lines: 1" in text
    assert "hit ratio memory: 0.2000 (32 of 160 tokens asked)" in text
    assert "hit ratio ssd: 0.2000 (32 of 160 tokens asked)" in text
    assert "hit ratio all: 0.4000 (64 of 160 tokens asked)" in text
    slow = text[text.index("slowest"):]
    assert slow.index(" c ") < slow.index(" a ")  # by last layer ready
    reasons = text[text.index("miss reasons"):]
    assert reasons.index("absent: 4") < reasons.index("evicted (capacity, memory): 1")
    assert "unreadable (corruption): 1" in reasons
    assert "slower_than_recompute (ssd): 1" in reasons
    bad = subprocess.run([kv_ldb, "explain", "--log=%s" % (tmp_path / "none")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "none" in bad.stderr + bad.stdout
