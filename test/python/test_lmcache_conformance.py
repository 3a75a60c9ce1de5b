"""The LMCache conformance check (lmcache_conformance.py) against a real LMCache tree when
one is present (LMCACHE_SOURCE_DIR, or an installed lmcache), and everywhere: the built
plug-in has the surface the check names, the stand-in adapter keeps LMCache's threading
facts, and the check fails, naming the problem, when they are broken."""
import ast
import textwrap

import pytest

import lmcache_conformance as lc
from kvengine.lmcache import KVEngineL2Plugin


def _real_tree():
    try:
        return lc.find_tree(None)
    except SystemExit:
        return None


REAL_TREE = _real_tree()


@pytest.mark.skipif(REAL_TREE is None, reason="skipped: no LMCache source tree (set "
                    "LMCACHE_SOURCE_DIR to an LMCache checkout, see docs/lmcache.md) and no "
                    "installed lmcache")
def test_stand_ins_conform_to_lmcache():
    problems = lc.run(REAL_TREE)
    assert problems == [], "\n".join(problems)


def test_the_plugin_has_the_surface_the_check_names():
    for name in lc.PLUGIN_METHODS:
        assert callable(getattr(KVEngineL2Plugin, name, None)), name
    import lmcache_fakes
    assert set(lmcache_fakes.REQUIRED_METHODS) <= lc.PLUGIN_METHODS


def test_the_stand_in_adapter_keeps_lmcache_threading_facts():
    adapter = lc.fake_definitions()["NativeConnectorL2Adapter"]
    assert lc.adapter_facts("stand-in", adapter) == []
    calls = lc.client_calls(adapter)
    assert {name for name, _ in calls} >= {"submit_batch_set", "submit_batch_get",
                                           "submit_batch_exists", "submit_batch_delete",
                                           "drain_completions", "close"}


def _class(src):
    return ast.parse(textwrap.dedent(src)).body[0]


def test_the_check_names_a_submit_outside_the_lock_and_a_wrong_completion_shape():
    broken = _class("""
        class NativeConnectorL2Adapter:
            def submit_store_task(self, keys, objects):
                future_id = self._client.submit_batch_set(keys, objects)
                with self._lock:
                    self._client.submit_batch_get(keys, objects)
                self._client.submit_batch_scan(keys)
            def _demux_loop(self):
                completions = self._client.drain_completions()
                for (future_id, ok, error) in completions:
                    pass
        """)
    problems = lc.adapter_facts("X", broken)
    assert any("submit_batch_set outside `with self._lock`" in p for p in problems), problems
    assert not any("submit_batch_get outside" in p for p in problems), problems
    assert any("submit_batch_scan, which kvengine's plug-in lacks" in p for p in problems)
    assert any("unpacks 3 fields" in p for p in problems), problems


def test_the_check_names_a_member_lmcache_lacks_and_a_signature_that_differs(tmp_path):
    mod = tmp_path / "lmcache" / "v1" / "distributed" / "l2_adapters"
    mod.mkdir(parents=True)
    (mod / "native_plugin_l2_adapter.py").write_text(textwrap.dedent("""
        class NativePluginL2AdapterConfig:
            def __init__(self, module_path, class_name, adapter_params=None):
                pass
            @classmethod
            def from_dict(cls, d):
                pass
            @classmethod
            def help(cls):
                pass
            def describe(self):
                pass
        """))
    tree = lc.vc.Tree(str(tmp_path))
    defs = lc.fake_definitions()
    theirs, _ = tree.find(lc.PLUGIN, "NativePluginL2AdapterConfig")
    problems = lc.compare_class("F", tree, lc.PLUGIN, defs["NativePluginL2AdapterConfig"],
                                theirs, "all", defs)
    assert any("F.__init__ takes" in p and "LMCache's takes" in p for p in problems), problems
    assert any("F.describe: LMCache's NativePluginL2AdapterConfig has it" in p
               for p in problems), problems


def test_the_check_names_what_the_constructor_calls_on_the_native_client():
    # LMCache's adapter calls native_client.event_fd() in its constructor, before it has
    # self._client, and probes getattr(native_client, "submit_batch_delete"): a method the
    # plug-in lacks there must be named too (the check once looked at self._client only).
    broken = _class("""
        class NativeConnectorL2Adapter:
            def __init__(self, native_client, other=None):
                self._client = native_client
                self._client_fd = int(native_client.event_fds())
                self._has_scan = callable(getattr(native_client, "submit_batch_scan", None))
                other.unrelated()
            def submit_store_task(self, keys, objects):
                with self._lock:
                    self._client.submit_batch_set(keys, objects)
            def _demux_loop(self):
                completions = self._client.drain_completions()
                for (future_id, ok, error, results) in completions:
                    pass
        """)
    problems = lc.adapter_facts("X", broken)
    assert "X calls self._client.event_fds, which kvengine's plug-in lacks" in problems, problems
    assert ("X uses, when present, self._client.submit_batch_scan, which kvengine's plug-in "
            "lacks") in problems, problems
    assert not any("outside `with self._lock`" in p for p in problems), problems
    assert not any("unrelated" in p for p in problems), problems
    assert len(problems) == 2, problems


def test_the_check_finds_a_class_lmcache_defines_under_a_platform_guard(tmp_path):
    # LMCache main defines EventfdNotifier under `if HAS_EVENTFD:` (a placeholder that
    # raises under `else:`); the check once looked only at a module's top-level
    # definitions and said the class was not in the tree.  The Linux branch is the one
    # compared: a member it lacks is named, the placeholder's members do not count.
    pkg = tmp_path / "lmcache" / "v1" / "platform"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from lmcache.v1.platform.event_notifier import EventfdNotifier as EventfdNotifier\n")
    (pkg / "event_notifier.py").write_text(textwrap.dedent("""
        import os
        HAS_EVENTFD = hasattr(os, "eventfd")
        if HAS_EVENTFD:
            class EventfdNotifier:
                def __init__(self):
                    pass
                def fileno(self):
                    pass
                def notify(self):
                    pass
                def consume(self):
                    pass
                def close(self):
                    pass
        else:
            class EventfdNotifier:
                def __init__(self):
                    raise RuntimeError("unreachable")
                def notify_fileno(self):
                    pass
        """))
    tree = lc.vc.Tree(str(tmp_path))
    theirs, why = tree.find("lmcache.v1.platform", "EventfdNotifier")
    assert theirs is not None, why
    assert {"fileno", "notify", "consume", "close"} <= set(lc.vc.members(theirs))
    defs = lc.fake_definitions()
    problems = lc.compare_class("F", tree, "lmcache.v1.platform", defs["EventfdNotifier"],
                                theirs, "subset", defs)
    assert problems == ["F.notify_fileno: LMCache's EventfdNotifier has no member "
                        "notify_fileno"], problems
