"""The SGLang backend's namespace option and model fingerprint (docs/sglang.md, "Keys and
values" and "Tenants and namespaces"), through the controller stand-in over a real
store reopened from disk."""
import json
import logging
import os

import pytest

torch = pytest.importorskip(
    "torch", reason="torch is not installed (Debian: apt-get install python3-torch)")

import kvengine  # noqa: E402
import sglang_fakes as fk  # noqa: E402
from kvengine import shared_store  # noqa: E402
from kvengine.sglang import keys as keys_mod  # noqa: E402

SMALL = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False)
PAGE = 16
TOKENS = list(range(3, 3 + 4 * PAGE + 5))  # 4 whole pages
LLAMA = dict(model_type="llama", num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, head_dim=32, hidden_size=256, rope_theta=500000.0,
             vocab_size=1000, transformers_version="4.57.0")


@pytest.fixture
def model_dir(tmp_path):
    """A local model directory, as `--model-path /models/x` names one: its config.json."""
    path = tmp_path / "llama-test"
    path.mkdir()
    write_config(str(path), LLAMA)
    return str(path)


def write_config(model_dir, config):
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f)


def controller(db_path, model_name, seed=1, **extra):
    fk.set_parallel(0, 1)
    dev, host = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    fk.fill_random(host, seed)
    config = fk.kvengine_extra_config(path=db_path, interface_v1=1, **SMALL)
    config.update(extra)
    return fk.make_controller(dev, host, config, model_name=model_name), host


def backup(c, host):
    hashes = fk.get_hash_str(TOKENS, None, PAGE)
    slots = host.alloc(len(hashes) * PAGE)
    op = fk.StorageOperation(slots, TOKENS, hash_value=hashes)
    c._page_backup(op)
    return op.completed_tokens, [fk.page_bytes(host, int(slots[i * PAGE]))
                                 for i in range(len(hashes))]


def hit_pages(c):
    _, hit_tokens = c._storage_hit_query(fk.PrefetchOperation("r", TOKENS))
    return hit_tokens // PAGE


def saved_by(db_path, model_name, **extra):
    c, host = controller(db_path, model_name, **extra)
    try:
        done, pages = backup(c, host)
        assert done == 4 * PAGE
        return pages, c.storage_backend._keys.fingerprint
    finally:
        c.detach_storage_backend()


def fingerprint_warnings(caplog):
    return [r for r in caplog.records
            if r.levelno == logging.WARNING and "fingerprint" in r.getMessage()]


@pytest.mark.parametrize("change", [
    {"rope_theta": 1000000.0}, {"num_key_value_heads": 1},
    {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}},
    {"quantization_config": {"quant_method": "fp8"}},
])
def test_a_changed_model_config_after_restart_misses_and_warns_once(db_path, model_dir, caplog,
                                                                      change):
    caplog.set_level(logging.WARNING, logger="kvengine.sglang")
    saved, old_fp = saved_by(db_path, model_dir)
    assert db_path not in shared_store._stores  # closed: reopened from disk below
    write_config(model_dir, dict(LLAMA, **change))  # same name, same page geometry
    caplog.clear()
    c, host = controller(db_path, model_dir, seed=2)
    try:
        new_fp = c.storage_backend._keys.fingerprint
        assert new_fp != old_fp
        assert hit_pages(c) == 0
        # The old pages' hashes, asked for directly, read nothing into the pool.
        slots = host.alloc(4 * PAGE)
        before = [fk.page_bytes(host, int(slots[i * PAGE])) for i in range(4)]
        got = c.storage_backend.batch_get_v1(fk.get_hash_str(TOKENS, None, PAGE), slots)
        assert got == [False] * 4
        assert [fk.page_bytes(host, int(slots[i * PAGE])) for i in range(4)] == before
        assert all(p not in saved for p in before)
        warned = fingerprint_warnings(caplog)
        assert len(warned) == 1
        assert "fingerprint %s, was %s" % (new_fp, old_fp) in warned[0].getMessage()
    finally:
        c.detach_storage_backend()
    # The old config again finds every page, and warns once the other way.
    write_config(model_dir, LLAMA)
    caplog.clear()
    c, host = controller(db_path, model_dir, seed=3)
    try:
        assert hit_pages(c) == 4
        warned = fingerprint_warnings(caplog)
        assert len(warned) == 1
        assert "fingerprint %s, was %s" % (old_fp, new_fp) in warned[0].getMessage()
    finally:
        c.detach_storage_backend()


def test_the_same_model_after_restart_hits_without_a_warning(db_path, model_dir, caplog):
    saved_by(db_path, model_dir)
    caplog.set_level(logging.WARNING, logger="kvengine.sglang")
    caplog.clear()
    c, _ = controller(db_path, model_dir, seed=2)
    try:
        assert hit_pages(c) == 4
        assert fingerprint_warnings(caplog) == []
    finally:
        c.detach_storage_backend()


def test_the_fingerprint_reads_sglangs_server_args(db_path, model_dir, monkeypatch):
    """Inside SGLang the model's path, revision, quantisation, KV cache dtype and config
    overrides come from its server args (get_global_server_args)."""
    def fp(args=None, config=None):
        if config is not None:
            write_config(model_dir, config)
        monkeypatch.setattr(keys_mod, "server_args", lambda: args)
        c, _ = controller(db_path, "served-name")
        try:
            return c.storage_backend._keys.fingerprint
        finally:
            c.detach_storage_backend()

    served = fp()  # "served-name" is no directory: no config.json found
    base = fp(fk.ServerArgs(model_path=model_dir))
    assert base != served
    assert fp(fk.ServerArgs(model_path=model_dir)) == base
    for changed in (dict(revision="v2"), dict(quantization="fp8"),
                    dict(kv_cache_dtype="fp8_e4m3"),
                    dict(json_model_override_args='{"rope_theta": 10000.0}')):
        assert fp(fk.ServerArgs(model_path=model_dir, **changed)) != base, changed
    # Config fields that do not change the KV leave it alone.
    assert fp(fk.ServerArgs(model_path=model_dir), dict(LLAMA, vocab_size=5)) == base
    assert fp(fk.ServerArgs(model_path=model_dir), dict(LLAMA, rope_theta=1.0)) != base


def test_only_rank_zero_checks_the_record(db_path, model_dir, caplog):
    saved_by(db_path, model_dir)
    write_config(model_dir, dict(LLAMA, rope_theta=1.0))
    caplog.set_level(logging.WARNING, logger="kvengine.sglang")
    caplog.clear()
    fk.set_parallel(1, 2)
    dev, host = fk.make_pools("mha", "page_first", torch.bfloat16, page_size=PAGE)
    c = fk.make_controller(dev, host, fk.kvengine_extra_config(path=db_path, **SMALL),
                           model_name=model_dir)
    try:
        assert fingerprint_warnings(caplog) == []
    finally:
        c.detach_storage_backend()


# ------------------------------------------------------------------ namespaces


def test_an_instance_namespace_keeps_its_pages_to_itself(db_path, model_dir):
    saved, _ = saved_by(db_path, model_dir, namespace="team-a",
                        namespace_options={"ssd_quota_bytes": 1 << 30})
    for other in ({"namespace": "team-b"}, {}):
        c, _ = controller(db_path, model_dir, seed=2, **other)
        try:
            assert hit_pages(c) == 0, other
        finally:
            c.detach_storage_backend()
    c, host = controller(db_path, model_dir, seed=2, namespace="team-a")
    try:
        assert hit_pages(c) == 4
        slots = host.alloc(4 * PAGE)
        assert c.storage_backend.batch_get_v1(fk.get_hash_str(TOKENS, None, PAGE), slots) == \
            [True] * 4
        assert [fk.page_bytes(host, int(slots[i * PAGE])) for i in range(4)] == saved
        db = shared_store._stores[db_path][0].handle
        listed = {n["name"]: n for n in db.list_namespaces()}
        assert listed["team-a"]["ssd_quota_bytes"] == 1 << 30
        # clear() removes the model's pages in this namespace only.
        c.storage_backend.clear()
        assert hit_pages(c) == 0
    finally:
        c.detach_storage_backend()


@pytest.mark.parametrize("extra, error", [
    ({"namespace": ["x"]}, ValueError),
    ({"namespace": "x", "namespace_options": {"weight": 2, "colour": 1}}, ValueError),
    ({"namespace": "bad name"}, kvengine.Error),
])
def test_bad_namespace_options_are_refused(db_path, model_dir, extra, error):
    with pytest.raises((error, ValueError)) as e:
        controller(db_path, model_dir, **extra)
    assert "namespace" in str(e.value)
    assert db_path not in shared_store._stores
