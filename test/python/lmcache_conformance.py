#!/usr/bin/env python3
"""Checks kvengine's LMCache stand-ins and plug-in surface against a real LMCache source tree.

    scripts/check_lmcache_conformance.py DIR     # an LMCache checkout (DIR/lmcache/...)
    test/python/lmcache_conformance.py DIR       # the same (or --lmcache-src DIR)
    test/python/lmcache_conformance.py           # $LMCACHE_SOURCE_DIR, else the
                                                 # installed lmcache package

Exit 0: every LMCache name checked exists with a compatible shape.  Exit 1: the
problems, one line each, naming the member.  Exit 77: no LMCache tree was found (the
check was skipped; pytest reports it as skipped).

What is checked, by reading the sources (nothing of LMCache is imported, so a tree
without its dependencies -- torch, CUDA -- is enough):

* test/python/lmcache_fakes.py: each stand-in class in FAKE_CLASSES has only members
  LMCache's class has (its own or inherited), each of the same kind with the same
  parameters and defaults; where FAKE_CLASSES says "all", also every public member
  LMCache's class defines itself.  Each stand-in function in FAKE_FUNCTIONS has
  LMCache's parameters.
* The plug-in surface: the methods LMCache's native_plugin factory requires (its
  required_methods list) are lmcache_fakes.REQUIRED_METHODS, and every method
  NativeConnectorL2Adapter calls on its native client (self._client.NAME, NAME on the
  constructor parameter it keeps as self._client, and getattr(client, "NAME") for a
  method it uses when present) is one of PLUGIN_METHODS, which
  test_lmcache_conformance.py checks the built plug-in has.
* What the plug-in's design rests on, in LMCache's adapter and in the stand-in alike:
  every self._client.submit_batch_* call is made inside `with self._lock:` (so a submit
  must never block), and the demux loop unpacks four fields per completion.

The stand-ins were last checked against LMCache main at the commit recorded in
docs/lmcache.md ("Conformance with LMCache main").
"""
import ast
import importlib.util
import os
import sys

import vllm_conformance as vc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKES = os.path.join(ROOT, "test", "python", "lmcache_fakes.py")
SKIPPED = 77
PROJECT = "LMCache"

L2 = "lmcache.v1.distributed.l2_adapters"
CONNECTOR = L2 + ".native_connector_l2_adapter"
PLUGIN = L2 + ".native_plugin_l2_adapter"

# (stand-in, LMCache module, LMCache class, coverage).  coverage "all": every public
# member LMCache's class defines itself; "subset": only what the stand-in needs, each as
# LMCache has it; "members": as subset, but the stand-in's constructor is its own (a
# test-made L1 object instead of one carved from LMCache's allocator).
FAKE_CLASSES = [
    ("ObjectKey", "lmcache.v1.distributed.api", "ObjectKey", "subset"),
    ("L2StoreResult", "lmcache.v1.distributed.internal_api", "L2StoreResult", "all"),
    ("EventfdNotifier", "lmcache.v1.platform", "EventfdNotifier", "subset"),
    ("TensorMemoryObj", "lmcache.v1.memory_management", "TensorMemoryObj", "members"),
    ("AdapterUsage", L2 + ".base", "AdapterUsage", "subset"),
    ("L2AdapterInterface", L2 + ".base", "L2AdapterInterface", "subset"),
    ("PersistConfig", L2 + ".config", "PersistConfig", "all"),
    ("L2AdapterConfigBase", L2 + ".config", "L2AdapterConfigBase", "subset"),
    ("L2AdaptersConfig", L2 + ".config", "L2AdaptersConfig", "all"),
    ("NativePluginL2AdapterConfig", PLUGIN, "NativePluginL2AdapterConfig", "all"),
    ("NativeConnectorL2Adapter", CONNECTOR, "NativeConnectorL2Adapter", "all"),
]

# (stand-in function, LMCache module).
FAKE_FUNCTIONS = [
    ("create_event_notifier", "lmcache.v1.platform"),
    ("register_l2_adapter_type", L2 + ".config"),
    ("get_type_name_for_config", L2 + ".config"),
    ("add_l2_adapters_args", L2 + ".config"),
    ("parse_args_to_l2_adapters_config", L2 + ".config"),
    ("register_l2_adapter_factory", L2 + ".factory"),
    ("create_l2_adapter_from_registry", L2 + ".factory"),
    ("_create_native_plugin_l2_adapter", PLUGIN),
    ("_object_key_to_string", CONNECTOR),
    ("_obj_to_memoryview", CONNECTOR),
]

# What kvengine.lmcache.KVEngineL2Plugin provides (python/src/lmcache_plugin.cc).
PLUGIN_METHODS = {"event_fd", "submit_batch_set", "submit_batch_get", "submit_batch_exists",
                  "submit_batch_delete", "drain_completions", "close"}


def fakes_module():
    return ast.parse(open(FAKES).read(), FAKES)


def fake_definitions():
    return {n.name: n for n in fakes_module().body
            if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def fake_members(cls, defs):
    """members() of a stand-in class and of its stand-in bases, base first."""
    out = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and isinstance(defs.get(base.id), ast.ClassDef):
            out.update(fake_members(defs[base.id], defs))
    out.update(vc.members(cls))
    return out


def compare_class(label, tree, module, ours, theirs, coverage, defs):
    problems = []
    mine = fake_members(ours, defs)
    lmcache = vc.all_members(tree, module, theirs)
    for name, (kind, node) in sorted(mine.items()):
        where = "%s.%s" % (label, name)
        if name not in lmcache:
            problems.append("%s: LMCache's %s has no member %s" % (where, theirs.name, name))
            continue
        their_kind, their_node = lmcache[name]
        if {kind, their_kind} <= {"field", "attribute"}:
            continue  # a class attribute or dataclass field: its presence is the contract
        if kind != their_kind:
            problems.append("%s is a %s; LMCache's is a %s" % (where, kind, their_kind))
        elif not (name == "__init__" and coverage == "members"):
            problems += vc.compare_signatures(where, node, their_node, project=PROJECT)
    if coverage == "all":
        for name in sorted(vc.members(theirs)):
            if vc.public(name) and name not in mine:
                problems.append("%s.%s: LMCache's %s has it; the stand-in lacks it" % (
                    label, name, theirs.name))
    return problems


def check_fakes(tree):
    problems = []
    defs = fake_definitions()
    for ours, module, theirs_name, coverage in FAKE_CLASSES:
        if ours not in defs:
            problems.append("lmcache_fakes.%s: listed but not defined" % ours)
            continue
        theirs, why = tree.find(module, theirs_name)
        if theirs is None:
            problems.append("lmcache_fakes.%s: %s" % (ours, why))
            continue
        problems += compare_class("lmcache_fakes." + ours, tree, module, defs[ours], theirs,
                                  coverage, defs)
    for name, module in FAKE_FUNCTIONS:
        theirs, why = tree.find(module, name)
        if theirs is None:
            problems.append("lmcache_fakes.%s: %s" % (name, why))
        elif name not in defs:
            problems.append("lmcache_fakes.%s: listed but not defined" % name)
        else:
            problems += vc.compare_signatures("lmcache_fakes." + name, defs[name], theirs,
                                              project=PROJECT)
    return problems


# ------------------------------------------------------------------ the adapter's facts

def is_self_attr(node, attr):
    return isinstance(node, ast.Attribute) and node.attr == attr and \
        isinstance(node.value, ast.Name) and node.value.id == "self"


def client_aliases(fn):
    """The parameters of `fn` it stores as self._client (NativeConnectorL2Adapter's
    constructor calls native_client.event_fd() before any self._client call)."""
    params = {a.arg for a in fn.args.args + fn.args.kwonlyargs}
    return {node.value.id for node in ast.walk(fn)
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
            and node.value.id in params and any(is_self_attr(t, "_client") for t in node.targets)}


def client_uses(cls):
    """(method name, under `with self._lock`, probed) for every use the adapter makes of
    its native client's methods: self._client.NAME(...), NAME(...) on the constructor
    parameter it keeps as self._client, and (probed=True) getattr(client, "NAME", ...) --
    a method it calls when present."""
    out = []

    def is_client(node, aliases):
        return is_self_attr(node, "_client") or (isinstance(node, ast.Name) and
                                                  node.id in aliases)

    def walk(node, locked, aliases):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            aliases = client_aliases(node)
        if isinstance(node, ast.With):
            locked = locked or any(is_self_attr(i.context_expr, "_lock") for i in node.items)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                is_client(node.func.value, aliases):
            out.append((node.func.attr, locked, False))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "getattr" and len(node.args) >= 2 and \
                is_client(node.args[0], aliases) and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str):
            out.append((node.args[1].value, locked, True))
        for child in ast.iter_child_nodes(node):
            walk(child, locked, aliases)

    walk(cls, False, set())
    return out


def client_calls(cls):
    """(method name, under `with self._lock`) for every call on the native client."""
    return [(name, locked) for name, locked, probed in client_uses(cls) if not probed]


def completion_arity(cls):
    """The number of names each completion is unpacked into in _demux_loop, or None."""
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "_demux_loop":
            for node in ast.walk(fn):
                if isinstance(node, ast.For) and isinstance(node.iter, ast.Name) and \
                        node.iter.id == "completions" and isinstance(node.target, ast.Tuple):
                    return len(node.target.elts)
    return None


def adapter_facts(label, cls):
    problems = []
    for name, locked, probed in client_uses(cls):
        if name not in PLUGIN_METHODS:
            problems.append("%s %s self._client.%s, which kvengine's plug-in lacks" % (
                label, "uses, when present," if probed else "calls", name))
        if name.startswith("submit_batch_") and not locked and not probed:
            problems.append("%s calls self._client.%s outside `with self._lock`" % (label, name))
    if not any(name.startswith("submit_batch_") for name, _ in client_calls(cls)):
        problems.append("%s: no self._client.submit_batch_* call found" % label)
    if completion_arity(cls) != 4:
        problems.append("%s._demux_loop unpacks %s fields per completion, not 4 (future_id, "
                        "ok, error, per-key results)" % (label, completion_arity(cls)))
    return problems


def required_methods(fn):
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and \
                any(isinstance(t, ast.Name) and t.id in ("required_methods", "REQUIRED_METHODS")
                    for t in node.targets):
            return [ast.literal_eval(e) for e in node.value.elts]
    return None


def check_plugin_surface(tree):
    problems = []
    factory, why = tree.find(PLUGIN, "_create_native_plugin_l2_adapter")
    if factory is None:
        return [why]
    theirs = required_methods(factory)
    ours = None
    for node in fakes_module().body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "REQUIRED_METHODS" for t in node.targets):
            ours = [ast.literal_eval(e) for e in node.value.elts]
    if theirs is None:
        problems.append("%s._create_native_plugin_l2_adapter: no required_methods list" % PLUGIN)
    elif sorted(theirs) != sorted(ours or []):
        problems.append("LMCache requires %s of a native plug-in; lmcache_fakes.REQUIRED_METHODS "
                        "is %s" % (sorted(theirs), sorted(ours or [])))
    elif not set(theirs) <= PLUGIN_METHODS:
        problems.append("LMCache requires %s, which kvengine's plug-in lacks" % sorted(
            set(theirs) - PLUGIN_METHODS))
    adapter, why = tree.find(CONNECTOR, "NativeConnectorL2Adapter")
    if adapter is None:
        return problems + [why]
    problems += adapter_facts("LMCache's NativeConnectorL2Adapter", adapter)
    problems += adapter_facts("lmcache_fakes.NativeConnectorL2Adapter",
                              fake_definitions()["NativeConnectorL2Adapter"])
    return problems


def find_tree(explicit):
    for candidate in (explicit, os.environ.get("LMCACHE_SOURCE_DIR")):
        if candidate:
            if not os.path.isdir(os.path.join(candidate, "lmcache")):
                raise SystemExit("%s: no lmcache/ package inside" % candidate)
            return candidate
    spec = importlib.util.find_spec("lmcache")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(spec.origin))
    return None


def run(src, parts=("fakes", "plugin")):
    tree = vc.Tree(src)
    problems = []
    if "fakes" in parts:
        problems += check_fakes(tree)
    if "plugin" in parts:
        problems += check_plugin_surface(tree)
    return problems


def main(argv=None):
    return vc.cli(argv, __doc__, "lmcache_conformance", "LMCache",
                  "an LMCache source tree (holding lmcache/)", find_tree, run,
                  parts="fakes,plugin")


if __name__ == "__main__":
    sys.exit(main())
