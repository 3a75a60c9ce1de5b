"""The vLLM connector's tenants (cache_salt, LoRA), namespaces and model fingerprint
(docs/vllm.md, "Tenants and namespaces" and "Keys and values"), on a real store."""
import logging

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
from kvengine import shared_store  # noqa: E402
from kvengine.vllm.common import tenant_of  # noqa: E402
from kvengine.vllm.connector import KVEngineConnector  # noqa: E402
from kvengine.vllm._vllm_compat import KVConnectorRole  # noqa: E402
import vllm_fakes as fk  # noqa: E402
from test_vllm_connector import BS, Instance, prefill_on, prompt, same_bytes  # noqa: E402

LAYOUT = fk.LAYOUTS[0]
BLOCKS = [3, 7, 1, 9]


@pytest.fixture(autouse=True)
def hash_seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")


def saved_by(path, req_kwargs=None, **config):
    """An instance that saves a 4-block prompt (with req_kwargs: cache_salt,
    lora_request) and closes; the bytes it saved, and its fingerprint."""
    a = Instance(path, LAYOUT, **config)
    try:
        req = fk.Request("a", prompt(4 * BS), BS, a.none_hash, **(req_kwargs or {}))
        prefill_on(a, req, BLOCKS)
        assert a.worker.num_saved_blocks == 4
        return [a.block(i) for i in BLOCKS], a.sched.connector_scheduler._keys.fingerprint
    finally:
        a.close()


def matched_on(path, req_kwargs=None, **config):
    """Tokens a fresh instance finds for the same prompt, and the instance (open)."""
    b = Instance(path, LAYOUT, **config)
    req = fk.Request("b", prompt(4 * BS), BS, b.none_hash, **(req_kwargs or {}))
    matched, _ = b.sched.get_num_new_matched_tokens(req, 0)
    return matched, b, req


# ------------------------------------------------------------------ tenants


@pytest.mark.parametrize("mine, theirs", [
    ({"cache_salt": "s1"}, {"cache_salt": "s2"}),
    ({"cache_salt": "s1"}, {}),
    ({}, {"cache_salt": "s1"}),
    ({"lora_request": fk.LoRARequest("sql-lora", 1, "/loras/sql")}, {}),
    ({"lora_request": fk.LoRARequest("sql-lora", 1, "/loras/sql")},
     {"lora_request": fk.LoRARequest("chat-lora", 2, "/loras/chat")}),
])
def test_tenants_never_share_a_prefix(db_path, mine, theirs):
    saved_by(db_path, mine)
    matched, b, _ = matched_on(db_path, theirs)
    b.close()
    assert matched == 0
    matched, b, _ = matched_on(db_path, mine)  # the same tenant finds it all
    b.close()
    assert matched == 4 * BS - 1


def test_the_tenant_in_the_key_separates_even_equal_block_hashes(db_path):
    """vLLM folds cache_salt and the LoRA name into its block hashes; the key's tenant
    part holds even when a hash did not (an older vLLM, a hash function ignoring extra
    keys): another tenant's lookup and load of the very same hashes miss."""
    saved, _ = saved_by(db_path, {"cache_salt": "alice"})
    b = Instance(db_path, LAYOUT)
    try:
        req = fk.Request("b", prompt(4 * BS), BS, b.none_hash, cache_salt="mallory")
        alice = fk.Request("x", prompt(4 * BS), BS, b.none_hash, cache_salt="alice")
        req.block_hashes = list(alice.block_hashes)  # the same hashes, another tenant
        assert b.sched.get_num_new_matched_tokens(req, 0) == (0, False)
        key = b.worker.block_key(alice.block_hashes[0].hex(), 0, tenant=tenant_of(alice))
        assert "alice" not in key and "@t%s/" % tenant_of(alice) in key
        db = shared_store._stores[db_path][0]
        assert db.is_exist(key) == 1
        assert db.is_exist(b.worker.block_key(alice.block_hashes[0].hex(), 0,
                                              tenant=tenant_of(req))) == 0
        assert len(saved) == 4
    finally:
        b.close()


def test_tenant_of_is_stable_and_none_without_salt_or_lora():
    r = fk.Request("r", prompt(BS), BS, b"\0" * 32)
    assert tenant_of(r) is None
    r.cache_salt = "s"
    t = tenant_of(r)
    assert len(t) == 16 and int(t, 16) >= 0 and tenant_of(r) == t
    r.lora_request = fk.LoRARequest("l", 1, "/p")
    assert tenant_of(r) not in (None, t)


# ------------------------------------------------------------------ namespaces


def test_an_instance_namespace_keeps_its_blocks_to_itself(db_path):
    saved, _ = saved_by(db_path, namespace="team-a",
                     namespace_options={"memory_quota_bytes": 1 << 20, "weight": 2})
    for other in ({"namespace": "team-b"}, {}):
        matched, b, _ = matched_on(db_path, **other)
        b.close()
        assert matched == 0, other
    matched, b, req = matched_on(db_path, namespace="team-a")
    try:
        assert matched == 4 * BS - 1
        db = shared_store._stores[db_path][0].handle
        ns = {n["name"]: n for n in db.list_namespaces()}
        assert ns["team-a"]["memory_quota_bytes"] == 1 << 20 and ns["team-a"]["weight"] == 2
        key = b.worker.block_key(req.block_hashes[0].hex(), 0)
        assert db.is_exist(key) == 0  # not in the default keyspace
        assert db.open_namespace("team-a").is_exist(key) == 1
        # The blocks load from the namespace, byte for byte.
        ids = [10, 2, 5, 11]
        b.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), matched)
        meta = b.sched.build_connector_meta(fk.new_step(new=[(req, ids, matched, 1)]))
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == set()
        for i in range(4):
            for x, y in zip(saved[i], b.block(ids[i])):
                assert same_bytes(x, y)
        # reset_cache clears this model in the namespace only.
        assert b.sched.reset_cache() is True
        assert db.open_namespace("team-a").is_exist(key) == 0
    finally:
        b.close()


@pytest.mark.parametrize("extra, needle", [
    ({"namespace": 5}, "namespace"),
    ({"namespace": ""}, "namespace"),
    ({"namespace": "x", "namespace_options": {"quota": 1}}, "namespace_options"),
    ({"namespace_options": {"weight": 2}}, "without"),
])
def test_bad_namespace_options_are_refused_naming_them(db_path, extra, needle):
    with pytest.raises(ValueError, match=needle):
        KVEngineConnector(fk.make_config(db_path, **extra), KVConnectorRole.SCHEDULER)
    assert db_path not in shared_store._stores  # nothing left open


def test_a_bad_namespace_name_fails_and_releases_the_store(db_path):
    with pytest.raises(kvengine.Error) as e:
        KVEngineConnector(fk.make_config(db_path, namespace="no/slash"),
                          KVConnectorRole.SCHEDULER)
    assert e.value.code == kvengine.INVALID_ARGUMENT
    assert db_path not in shared_store._stores


# ------------------------------------------------------------------ model fingerprint


def fingerprint_warnings(caplog):
    return [r for r in caplog.records
            if r.levelno == logging.WARNING and "fingerprint" in r.getMessage()]


@pytest.mark.parametrize("changed", [
    {"hf_overrides": {"rope_theta": 1000000.0}},
    {"hf_overrides": {"num_key_value_heads": 4}},
    {"revision": "v2"},
    {"hf_overrides": {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}},
])
def test_a_changed_model_after_restart_misses_and_warns_once(db_path, caplog, changed):
    """The same model name over a store reopened from disk, with a config that changes
    the KV: every block misses (lookups and loads), and one warning names both
    fingerprints; the old config, restarted, finds its bytes again."""
    caplog.set_level(logging.WARNING, logger="kvengine.vllm")
    saved, old_fp = saved_by(db_path)
    assert db_path not in shared_store._stores  # closed: the next instance reopens it
    caplog.clear()
    matched, b, req = matched_on(db_path, **changed)
    try:
        assert matched == 0
        warned = fingerprint_warnings(caplog)
        assert len(warned) == 1
        new_fp = b.sched.connector_scheduler._keys.fingerprint
        old_key = b.sched.connector_scheduler._keys.fingerprint_record_key()
        text = warned[0].getMessage()
        assert new_fp != old_fp and new_fp in text and "was %s" % old_fp in text
        # A load of the old blocks' hashes, forced past the lookup, reads nothing.
        ids = [10, 2, 5, 11]
        b.sched.update_state_after_alloc(req, fk.KVCacheBlocks(ids), 4 * BS)
        meta = b.sched.build_connector_meta(fk.new_step(new=[(req, ids, 4 * BS, 1)]))
        fk.run_worker_step(b.worker, meta, b.caches, LAYOUT)
        assert b.worker.get_block_ids_with_load_errors() == set(ids)
        assert all(not same_bytes(x, y) for i in range(4)
                   for x, y in zip(saved[i], b.block(ids[i])))
    finally:
        b.close()
    assert old_key.endswith("/fingerprint")
    # The old config again: its blocks are all there; it warns once, naming both.
    caplog.clear()
    matched, c, _ = matched_on(db_path)
    c.close()
    assert matched == 4 * BS - 1
    warned = fingerprint_warnings(caplog)
    assert len(warned) == 1 and "fingerprint %s, was %s" % (old_fp, new_fp) in \
        warned[0].getMessage()


def test_the_same_model_after_restart_hits_without_a_warning(db_path, caplog):
    saved_by(db_path)
    caplog.set_level(logging.WARNING, logger="kvengine.vllm")
    caplog.clear()
    matched, b, _ = matched_on(db_path)
    b.close()
    assert matched == 4 * BS - 1
    assert fingerprint_warnings(caplog) == []


def test_the_fingerprint_covers_what_changes_kv_and_nothing_else(db_path):
    def fp(**kw):
        c = KVEngineConnector(fk.make_config(db_path, **kw), KVConnectorRole.SCHEDULER)
        try:
            return c.connector_scheduler._keys.fingerprint
        finally:
            c.shutdown()

    base = fp()
    assert fp() == base
    # Fields that do not change the KV bytes leave it alone.
    assert fp(hf_overrides={"vocab_size": 1000, "transformers_version": "9.9"}) == base
    assert fp(request_account_sample=0.5) == base
    for changed in ({"hf_overrides": {"num_hidden_layers": 16}},
                    {"hf_overrides": {"head_dim": 64}},
                    {"hf_overrides": {"quantization_config": {"quant_method": "fp8"}}},
                    {"revision": "abc"}, {"model": "other/model"},
                    {"dtype": torch.bfloat16}, {"block_size": 32}):
        assert fp(**changed) != base, changed
