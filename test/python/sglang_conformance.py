#!/usr/bin/env python3
"""Checks kvengine's SGLang stand-ins and backend against a real SGLang source tree.

    scripts/check_sglang_conformance.py DIR              # an SGLang checkout (DIR/python/
                                                         # sglang/...) or DIR/sglang/...
    test/python/sglang_conformance.py DIR                # the same (or --sglang-src DIR)
    test/python/sglang_conformance.py                    # $SGLANG_SOURCE_DIR, else the
                                                         # installed sglang package

Exit 0: every SGLang name checked exists in the tree with a compatible shape.  Exit 1:
the problems, one line each, naming the member.  Exit 77: no SGLang tree was found.

What is checked, by reading the sources (nothing of SGLang is imported), with the
machinery of vllm_conformance.py:

* python/kvengine/sglang/_sglang_compat.py: each stand-in (HiCacheStorage,
  HiCacheStorageConfig, HiCacheStorageExtraInfo, StorageMetrics) is a name the module
  imports from SGLang when SGLang is present, and has every public member of SGLang's
  class and nothing it lacks, each of the same kind, parameters and defaults; the
  v2 interface's dataclasses and enums (PoolName, PoolHitPolicy, PoolTransfer,
  PoolTransferResult, SidecarPoolSpec, PrefetchTimeoutConfig) too, and each enum
  member's value.
* The backend package: every `from sglang... import` resolves in the tree, and every
  method KVEngineHiCacheStorage overrides keeps HiCacheStorage's parameters.
* test/python/sglang_fakes.py: each class in FAKE_CLASSES has only members SGLang's
  class has (through its bases), with SGLang's parameters and defaults; each function in
  FAKE_FUNCTIONS has SGLang's parameters.

docs/sglang.md ("Conformance with SGLang main") records the commit last checked.
"""
import ast
import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_conformance as vc  # noqa: E402 -- the shared AST machinery

ROOT = vc.ROOT
COMPAT = os.path.join(ROOT, "python", "kvengine", "sglang", "_sglang_compat.py")
PACKAGE = os.path.join(ROOT, "python", "kvengine", "sglang")
FAKES = os.path.join(ROOT, "test", "python", "sglang_fakes.py")
SKIPPED = 77
PROJECT = "SGLang"

_MEM = "sglang.srt.mem_cache"
# (stand-in class, SGLang module, SGLang class, coverage): "subset" = only members the
# tests need, each as SGLang has it.
FAKE_CLASSES = [
    ("StorageBackendFactory", _MEM + ".storage.backend_factory", "StorageBackendFactory",
     "subset"),
    ("KVCache", _MEM + ".memory_pool", "KVCache", "subset"),
    ("ServerArgs", "sglang.srt.server_args", "ServerArgs", "subset"),
    ("MHATokenToKVPool", _MEM + ".memory_pool", "MHATokenToKVPool", "subset"),
    ("MLATokenToKVPool", _MEM + ".memory_pool", "MLATokenToKVPool", "subset"),
    ("HostKVCache", _MEM + ".pool_host.base", "HostKVCache", "subset"),
    ("MHATokenToKVPoolHost", _MEM + ".pool_host.mha", "MHATokenToKVPoolHost", "subset"),
    ("MLATokenToKVPoolHost", _MEM + ".pool_host.mla", "MLATokenToKVPoolHost", "subset"),
    ("TokenToKVPoolAllocator", _MEM + ".allocator.token", "TokenToKVPoolAllocator", "subset"),
    ("StorageOperation", "sglang.srt.managers.cache_controller", "StorageOperation", "subset"),
    ("PrefetchOperation", "sglang.srt.managers.cache_controller", "PrefetchOperation",
     "subset"),
    ("HiCacheController", "sglang.srt.managers.cache_controller", "HiCacheController",
     "subset"),
    # Hybrid models (the v2 interface).
    ("DSATokenToKVPool", _MEM + ".memory_pool", "DSATokenToKVPool", "subset"),
    ("MambaPoolHost", _MEM + ".memory_pool_host", "MambaPoolHost", "subset"),
    ("DSAIndexerPoolHost", _MEM + ".memory_pool_host", "DSAIndexerPoolHost", "subset"),
    ("LogicalHostPool", _MEM + ".memory_pool_host", "LogicalHostPool", "subset"),
    ("PoolEntry", _MEM + ".memory_pool_host", "PoolEntry", "subset"),
    ("HostPoolGroup", _MEM + ".memory_pool_host", "HostPoolGroup", "subset"),
    ("HybridStorageOperation", _MEM + ".hybrid_cache.hybrid_cache_controller",
     "StorageOperation", "subset"),
    ("HybridPrefetchOperation", _MEM + ".hybrid_cache.hybrid_cache_controller",
     "PrefetchOperation", "subset"),
    ("HybridCacheController", _MEM + ".hybrid_cache.hybrid_cache_controller",
     "HybridCacheController", "subset"),
]
FAKE_FUNCTIONS = [
    ("get_hash_str", _MEM + ".utils", "get_hash_str"),
    ("get_parallel", "sglang.srt.runtime_context", "get_parallel"),
    ("get_global_server_args", "sglang.srt.server_args", "get_global_server_args"),
]
# Module-level names the fakes mirror: (name, SGLang module).
FAKE_CONSTANTS = [("STORAGE_BATCH_SIZE", _MEM + ".hicache_storage")]


def stand_in_classes():
    return vc.stand_in_classes((COMPAT, FAKES))


def check_package(tree):
    """The backend's imports from SGLang, and KVEngineHiCacheStorage's overrides."""
    problems = []
    module = _MEM + ".hicache_storage"
    base, why = tree.find(module, "HiCacheStorage")
    if base is None:
        return [why]
    base_members = vc.all_members(tree, module, base)
    for fname in sorted(os.listdir(PACKAGE)):
        if not fname.endswith(".py") or fname == "_sglang_compat.py":
            continue
        path = os.path.join(PACKAGE, fname)
        for node in ast.walk(ast.parse(open(path).read(), path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "sglang":
                for alias in node.names:
                    if tree.find(node.module, alias.name)[0] is None:
                        problems.append("%s imports %s: %s" % (
                            fname, alias.name, tree.find(node.module, alias.name)[1]))
            if isinstance(node, ast.ClassDef) and node.name == "KVEngineHiCacheStorage":
                for name, (kind, fn) in sorted(vc.members(node).items()):
                    if name not in base_members or name == "__init__" or \
                            base_members[name][0] in ("field", "attribute"):
                        continue
                    where = "KVEngineHiCacheStorage.%s" % name
                    their_kind, their_fn = base_members[name]
                    if kind != their_kind:
                        problems.append("%s is a %s; HiCacheStorage's is a %s" % (
                            where, kind, their_kind))
                    else:
                        problems += vc.compare_signatures(where, fn, their_fn, True, PROJECT)
    return problems


def check_enum_values(tree):
    """The values of the compat module's Enum stand-ins (PoolName, PoolHitPolicy): the
    pool names are the strings SGLang's controller passes and keys are built from, so a
    renamed value is a problem even where the member name stays."""
    problems = []
    imported, defined = vc.compat_stand_ins(COMPAT, "sglang")
    for node in defined:
        bases = {getattr(b, "id", getattr(b, "attr", None)) for b in getattr(node, "bases", [])}
        if "Enum" not in bases or node.name not in imported:
            continue
        theirs, _ = tree.find(imported[node.name], node.name)
        if theirs is None:
            continue  # check_compat names it
        values = {}
        for cls, out in ((node, "ours"), (theirs, "theirs")):
            values[out] = {t.id: vc.literal(stmt.value) for stmt in cls.body
                           if isinstance(stmt, ast.Assign) for t in stmt.targets
                           if isinstance(t, ast.Name)}
        for name, value in sorted(values["ours"].items()):
            if name in values["theirs"] and value != values["theirs"][name]:
                problems.append("_sglang_compat.%s.%s = %r; %s's is %r" % (
                    node.name, name, value[1], PROJECT, values["theirs"][name][1]))
    # Dataclass fields whose default is an enum member (PoolTransfer.hit_policy): the
    # generic check leaves expressions alone, so the member is compared here.
    enums = {n.name for n in defined if "Enum" in {getattr(b, "id", None) for b in n.bases}}
    for node in defined:
        theirs, _ = tree.find(imported.get(node.name, ""), node.name) \
            if node.name in imported else (None, None)
        if not isinstance(theirs, ast.ClassDef) or not vc.is_dataclass(node):
            continue
        their_fields = {n.target.id: n.value for n in theirs.body
                        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for field in node.body:
            if not (isinstance(field, ast.AnnAssign) and isinstance(field.value, ast.Attribute)
                    and getattr(field.value.value, "id", None) in enums):
                continue
            ours = ast.unparse(field.value)
            theirs_value = their_fields.get(field.target.id)
            if theirs_value is not None and ast.unparse(theirs_value) != ours:
                problems.append("_sglang_compat.%s.%s: default %s; %s's %s" % (
                    node.name, field.target.id, ours, PROJECT, ast.unparse(theirs_value)))
    return problems


def check_fakes(tree):
    stand_ins = stand_in_classes()
    problems = vc.check_fakes(tree, FAKES, FAKE_CLASSES, PROJECT, stand_ins)
    fakes = ast.parse(open(FAKES).read(), FAKES)
    functions = {n.name: n for n in fakes.body if isinstance(n, ast.FunctionDef)}
    for ours, module, theirs_name in FAKE_FUNCTIONS:
        theirs, why = tree.find(module, theirs_name)
        if theirs is None or ours not in functions:
            problems.append("sglang_fakes.%s: %s" % (ours, why or "not defined"))
            continue
        problems += vc.compare_signatures("sglang_fakes." + ours, functions[ours], theirs,
                                          project=PROJECT)
    ours_values = {t.id: n.value for n in fakes.body if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name)}
    for name, module in FAKE_CONSTANTS:
        theirs = tree.module(module)
        values = {t.id: n.value for n in (theirs.body if theirs else [])
                  if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        if name not in values:
            problems.append("sglang_fakes.%s: %s has no %s" % (name, module, name))
        elif vc.literal(values[name]) != vc.literal(ours_values.get(name)):
            problems.append("sglang_fakes.%s = %s; SGLang's is %s" % (
                name, ast.unparse(ours_values[name]), ast.unparse(values[name])))
    return problems


def find_tree(explicit):
    """The directory holding sglang/ (a checkout's python/, or site-packages)."""
    for candidate in (explicit, os.environ.get("SGLANG_SOURCE_DIR")):
        if candidate:
            for sub in ("python", ""):
                if os.path.isdir(os.path.join(candidate, sub, "sglang", "srt")):
                    return os.path.join(candidate, sub) if sub else candidate
            raise SystemExit("%s: no sglang/srt/ (or python/sglang/srt/) inside" % candidate)
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(spec.origin))
    return None


def run(src, parts=("compat", "package", "fakes")):
    tree = vc.Tree(src)
    problems = []
    if "compat" in parts:
        problems += vc.check_compat(tree, COMPAT, "sglang", PROJECT, stand_in_classes())
        problems += check_enum_values(tree)
    if "package" in parts:
        problems += check_package(tree)
    if "fakes" in parts:
        problems += check_fakes(tree)
    return problems


def main(argv=None):
    return vc.cli(argv, __doc__, "sglang_conformance", "SGLang", "an SGLang source tree",
                  find_tree, run)


if __name__ == "__main__":
    sys.exit(main())
