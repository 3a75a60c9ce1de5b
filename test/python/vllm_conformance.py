#!/usr/bin/env python3
"""Checks kvengine's vLLM stand-ins and the connector against a real vLLM source tree.

    scripts/check_vllm_conformance.py DIR           # a vLLM checkout (DIR/vllm/...)
    test/python/vllm_conformance.py DIR             # the same (or --vllm-src DIR)
    test/python/vllm_conformance.py                 # $VLLM_SOURCE_DIR, else the
                                                    # installed vllm package

Exit 0: every vLLM name checked exists in the tree with a compatible shape.  Exit 1:
the problems, one line each, naming the member.  Exit 77: no vLLM tree was found (the
check was skipped; CTest and pytest report it as skipped).

What is checked, by reading the sources (nothing of vLLM is imported, so a tree without
its dependencies is enough):

* python/kvengine/vllm/_vllm_compat.py: the stand-ins defined where vLLM is absent.
  Each is one of the names the module imports from vLLM when vLLM is present (so the
  module defines nothing vLLM does not have), and each matches vLLM's definition: a
  class has every public member of vLLM's class and nothing vLLM's class lacks, each
  member of the same kind (method, property, classmethod, staticmethod, dataclass
  field) with the same parameters in the same order and the same defaults; a function
  has vLLM's parameters.
* The connector package: every `from vllm... import name` resolves to a definition in
  the tree, and every method KVEngineConnector overrides keeps the base's parameters.
* test/python/vllm_fakes.py: each stand-in class listed in FAKES below has only
  members vLLM's class has, with compatible parameters, and (where FAKES says "all")
  every public member vLLM's class has; dataclass fields keep vLLM's defaults.

The stand-ins were last checked against vLLM main at the commit recorded in
docs/vllm.md ("Conformance with vLLM main").
"""
import argparse
import ast
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPAT = os.path.join(ROOT, "python", "kvengine", "vllm", "_vllm_compat.py")
PACKAGE = os.path.join(ROOT, "python", "kvengine", "vllm")
FAKES = os.path.join(ROOT, "test", "python", "vllm_fakes.py")
SKIPPED = 77

# test/python/vllm_fakes.py's stand-ins: (class, vLLM module, vLLM class, coverage).
# coverage "all": the stand-in has every public member; "subset": only what the tests
# need, each as vLLM has it.
FAKE_CLASSES = [
    ("KVTransferConfig", "vllm.config.kv_transfer", "KVTransferConfig", "subset"),
    ("ModelConfig", "vllm.config.model", "ModelConfig", "subset"),
    ("LoRARequest", "vllm.lora.request", "LoRARequest", "subset"),
    ("CacheConfig", "vllm.config.cache", "CacheConfig", "subset"),
    ("ParallelConfig", "vllm.config.parallel", "ParallelConfig", "subset"),
    ("VllmConfig", "vllm.config.vllm", "VllmConfig", "subset"),
    ("KVEventsConfig", "vllm.config.kv_events", "KVEventsConfig", "all"),
    ("KVConnectorOutput", "vllm.v1.outputs", "KVConnectorOutput", "all"),
    ("ModelRunnerOutput", "vllm.v1.outputs", "ModelRunnerOutput", "subset"),
    ("KVOutputAggregator", "vllm.distributed.kv_transfer.kv_connector.utils",
     "KVOutputAggregator", "all"),
    ("KVCacheGroupSpec", "vllm.v1.kv_cache_interface", "KVCacheGroupSpec", "subset"),
    ("KVCacheTensor", "vllm.v1.kv_cache_interface", "KVCacheTensor", "subset"),
    ("FullAttentionSpec", "vllm.v1.kv_cache_interface", "FullAttentionSpec", "subset"),
    ("SlidingWindowSpec", "vllm.v1.kv_cache_interface", "SlidingWindowSpec", "subset"),
    ("ChunkedLocalAttentionSpec", "vllm.v1.kv_cache_interface", "ChunkedLocalAttentionSpec",
     "subset"),
    ("MambaSpec", "vllm.v1.kv_cache_interface", "MambaSpec", "subset"),
    ("BlockPool", "vllm.v1.core.block_pool", "BlockPool", "subset"),
    ("MambaManager", "vllm.v1.core.single_type_kv_cache_manager", "MambaManager", "subset"),
    ("KVCacheConfig", "vllm.v1.kv_cache_interface", "KVCacheConfig", "subset"),
    ("NewRequestData", "vllm.v1.core.sched.output", "NewRequestData", "subset"),
    ("CachedRequestData", "vllm.v1.core.sched.output", "CachedRequestData", "subset"),
    ("SchedulerOutput", "vllm.v1.core.sched.output", "SchedulerOutput", "subset"),
    ("KVConnectorFactory", "vllm.distributed.kv_transfer.kv_connector.factory",
     "KVConnectorFactory", "subset"),
    ("KVConnectorProm", "vllm.distributed.kv_transfer.kv_connector.v1.metrics",
     "KVConnectorProm", "all"),
    ("MultiKVConnectorStats", "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector",
     "MultiKVConnectorStats", "all"),
    ("MultiKVConnectorPromMetrics",
     "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector",
     "MultiKVConnectorPromMetrics", "all"),
    ("MultiConnector", "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector",
     "MultiConnector", "subset"),
]


# ------------------------------------------------------------------ reading a tree

def guarded_definitions(body):
    """The classes and functions a module defines under a top-level `if`/`else` or `try`,
    in source order -- e.g. LMCache's `if HAS_EVENTFD: class EventfdNotifier ... else:
    class EventfdNotifier` (placeholder).  The first branch comes first, which is the one
    a Linux host (the only one kvengine targets) takes."""
    for node in body:
        blocks = []
        if isinstance(node, ast.If):
            blocks = [node.body, node.orelse]
        elif isinstance(node, ast.Try):
            blocks = [node.body] + [h.body for h in node.handlers] + [node.orelse,
                                                                      node.finalbody]
        for block in blocks:
            for child in block:
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield child
            yield from guarded_definitions(block)


class Tree:
    """The modules of a vLLM source tree, parsed on demand."""

    def __init__(self, src):
        self.src = src
        self._parsed = {}

    def path_of(self, module):
        base = os.path.join(self.src, *module.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return candidate
        return None

    def module(self, module):
        if module not in self._parsed:
            path = self.path_of(module)
            self._parsed[module] = None if path is None else ast.parse(open(path).read(), path)
        return self._parsed[module]

    def find(self, module, name, depth=0):
        """The ClassDef / FunctionDef / AnnAssign named `name` in `module`, following
        re-exports (`from x import name`); (None, why) when there is none."""
        tree = self.module(module)
        if tree is None:
            return None, "module %s is not in the tree" % module
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and node.name == name:
                return node, None
        for node in guarded_definitions(tree.body):
            if node.name == name:
                return node, None
        if depth < 4:
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    for alias in node.names:
                        if (alias.asname or alias.name) == name:
                            return self.find(node.module, alias.name, depth + 1)
        return None, "%s.%s is not defined in the tree" % (module, name)

    def imported_names(self, module):
        """name -> the module it is imported from, for a module's `from ... import`s."""
        out = {}
        tree = self.module(module)
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    out[alias.asname or alias.name] = node.module
        return out


# ------------------------------------------------------------------ members of a class

def decorator_names(fn):
    out = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Name):
            out.add(d.id)
        elif isinstance(d, ast.Attribute):
            out.add(d.attr)
        elif isinstance(d, ast.Call):
            out.add(getattr(d.func, "id", getattr(d.func, "attr", "")))
    return out


def kind_of(fn):
    names = decorator_names(fn)
    for k in ("property", "classmethod", "staticmethod"):
        if k in names:
            return k
    if "setter" in names:
        return "setter"
    return "method"


def is_dataclass(cls):
    # vLLM's configs are dataclasses through its @config decorator.
    return bool({"dataclass", "config"} & decorator_names(cls))


def members(cls):
    """name -> (kind, node) for a class body: methods, properties, class attributes and
    dataclass fields (kind "field")."""
    out = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind = kind_of(node)
            if kind != "setter":
                out[node.name] = (kind, node)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = ("field" if is_dataclass(cls) else "attribute", node)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = ("attribute", node)
    return out


def all_members(tree, module, cls, depth=0):
    """members() of cls and of its bases that resolve in the tree (base first)."""
    out = {}
    if depth < 6:
        imports = tree.imported_names(module)
        for base in cls.bases:
            name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
            if name is None or name in ("ABC", "object", "Generic", "Protocol"):
                continue
            base_module = imports.get(name, module)
            node, _ = tree.find(base_module, name)
            if node is None:  # imported under another name (`import X as BaseX`)
                node, _ = tree.find(module, name)
            if isinstance(node, ast.ClassDef):
                out.update(all_members(tree, base_module, node, depth + 1))
    out.update(members(cls))
    return out


def public(name):
    return not name.startswith("_") or name == "__init__"


# ------------------------------------------------------------------ signatures

def literal(node):
    if node is None:
        return None
    try:
        return ("value", ast.literal_eval(node))
    except (ValueError, SyntaxError, TypeError):
        return ("expr", ast.unparse(node))


def params(fn):
    """(positional names, keyword-only names, *args?, **kwargs?, defaults of each name)."""
    a = fn.args
    positional = [p.arg for p in a.posonlyargs + a.args]
    defaults = {}
    for p, d in zip(reversed(a.posonlyargs + a.args), reversed(a.defaults)):
        defaults[p.arg] = literal(d)
    for p, d in zip(a.kwonlyargs, a.kw_defaults):
        if d is not None:
            defaults[p.arg] = literal(d)
    return positional, [p.arg for p in a.kwonlyargs], a.vararg is not None, \
        a.kwarg is not None, defaults


def compare_signatures(where, ours, theirs, allow_extra_optional=False, project="vLLM"):
    """Problems of `ours` against the project's (vLLM's) `theirs` (two FunctionDefs)."""
    p1, k1, v1, kw1, d1 = params(ours)
    p2, k2, v2, kw2, d2 = params(theirs)
    problems = []
    if allow_extra_optional:  # an override may take more, if optional, after the base's
        extra = [p for p in p1[len(p2):] if p not in d1]
        if p1[:len(p2)] != p2 or extra:
            problems.append("%s takes (%s); %s's takes (%s)" % (where, ", ".join(p1), project,
                                                                  ", ".join(p2)))
    elif p1 != p2 or sorted(k1) != sorted(k2):
        problems.append("%s takes (%s%s); %s's takes (%s%s)" % (
            where, ", ".join(p1), "; *, " + ", ".join(k1) if k1 else "", project,
            ", ".join(p2), "; *, " + ", ".join(k2) if k2 else ""))
    if not allow_extra_optional and (v1, kw1) != (v2, kw2):
        problems.append("%s: *args/**kwargs %s; %s's %s" % (where, (v1, kw1), project,
                                                               (v2, kw2)))
    for name in p2 + k2:
        if (name in d1) != (name in d2):
            problems.append("%s: parameter %s %s a default in %s" % (
                where, name, "has no" if name in d2 else "has", project))
        elif name in d1 and d1[name][0] == "value" and d2[name][0] == "value" \
                and d1[name] != d2[name]:
            problems.append("%s: parameter %s defaults to %r; %s's to %r" % (
                where, name, d1[name][1], project, d2[name][1]))
    return problems


def field_default(node):
    value = node.value
    # dataclasses.field and pydantic's Field (vLLM's configs) alike.
    if isinstance(value, ast.Call) and getattr(value.func, "attr",
                                               getattr(value.func, "id", "")) in ("field", "Field"):
        for kw in value.keywords:
            if kw.arg == "default":
                return literal(kw.value)
            if kw.arg == "default_factory":
                return ("factory", ast.unparse(kw.value))
        return None
    return literal(value) if value is not None else None


def stand_in_members(ours, stand_ins):
    """members() of a stand-in class and of its bases that are stand-ins themselves
    (`compat.KVConnectorStats`, or a class of the same file), base first."""
    out = {}
    for base in ours.bases:
        name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        if name in stand_ins and stand_ins[name] is not ours:
            out.update(stand_in_members(stand_ins[name], stand_ins))
    out.update(members(ours))
    return out


def other_package_stand_ins(tree):
    """The classes _vllm_compat.py defines in a nested try, standing in for another
    package (prometheus_client's metric classes, msgspec.Struct): not vLLM's, so their
    members are not compared."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for handler in node.handlers:
                for inner in ast.walk(handler):
                    if isinstance(inner, ast.Try):
                        for h in inner.handlers:
                            out.update(n for n in ast.walk(h) if isinstance(n, ast.ClassDef))
    return out


def stand_in_classes(paths=(COMPAT, FAKES)):
    """Every class the stand-in files (_vllm_compat.py and vllm_fakes.py) define, by name
    (less the stand-ins of other packages)."""
    out = {}
    for path in paths:
        parsed = ast.parse(open(path).read(), path)
        skip = other_package_stand_ins(parsed)
        for node in ast.walk(parsed):
            if isinstance(node, ast.ClassDef) and node not in skip:
                out.setdefault(node.name, node)
    return out


def describe_default(d):
    if d is None:
        return "none (required)"
    return repr(d[1]) if d[0] == "value" else d[1]


def compare_class(label, tree, module, ours, theirs, coverage, stand_ins=None,
                  project="vLLM"):
    """Problems of the stand-in class `ours` against the project's `theirs`; stand_ins
    are the classes its stand-in bases resolve in (default: the vLLM stand-ins)."""
    problems = []
    mine = stand_in_members(ours, stand_in_classes() if stand_ins is None else stand_ins)
    vllm = all_members(tree, module, theirs)
    for name, (kind, node) in sorted(mine.items()):
        where = "%s.%s" % (label, name)
        if name not in vllm:
            problems.append("%s: %s's %s has no member %s" % (where, project, theirs.name,
                                                                 name))
            continue
        their_kind, their_node = vllm[name]
        if {kind, their_kind} <= {"field", "attribute"}:
            if isinstance(node, ast.AnnAssign) and isinstance(their_node, ast.AnnAssign):
                d1, d2 = field_default(node), field_default(their_node)
                if d1 != d2 and not (d1 and d2 and "expr" in (d1[0], d2[0])):
                    problems.append("%s: default %s; %s's %s" % (
                        where, describe_default(d1), project, describe_default(d2)))
            continue
        if kind != their_kind:
            problems.append("%s is a %s; %s's is a %s" % (where, kind, project, their_kind))
            continue
        problems += compare_signatures(where, node, their_node, project=project)
    if coverage == "all":
        for name in sorted(vllm):
            if public(name) and name not in mine:
                problems.append("%s.%s: %s's %s has it; the stand-in lacks it" % (
                    label, name, project, theirs.name))
    return problems


# ------------------------------------------------------------------ the checks

def compat_stand_ins(compat=COMPAT, package="vllm"):
    """(name -> module) imported when the project (vLLM) is present, and the definitions
    made when it is absent, from the compat module's try/except ImportError."""
    tree = ast.parse(open(compat).read(), compat)
    for node in tree.body:
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                for h in node.handlers):
            imported = {}
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom) and stmt.module.startswith(package):
                    for alias in stmt.names:
                        imported[alias.asname or alias.name] = stmt.module
            # Only the handler's own definitions: those in a nested try (the
            # prometheus_client classes when it is missing) stand in for that package.
            defined = [stmt for stmt in node.handlers[0].body
                       if isinstance(stmt, (ast.ClassDef, ast.FunctionDef))]
            return imported, defined
    raise SystemExit("%s: no try/except ImportError around %s's imports" % (compat, package))


def check_compat(tree, compat=COMPAT, package="vllm", project="vLLM", stand_ins=None):
    """The compat module's stand-ins against the project's definitions ("all")."""
    problems = []
    label = os.path.splitext(os.path.basename(compat))[0]
    imported, defined = compat_stand_ins(compat, package)
    for node in defined:
        if node.name not in imported:
            problems.append("%s.%s: defined as a stand-in but not imported from %s when %s "
                            "is present (%s main has no such name?)" % (
                                label, node.name, project, project, project))
            continue
        theirs, why = tree.find(imported[node.name], node.name)
        if theirs is None:
            problems.append("%s.%s: %s" % (label, node.name, why))
        elif type(theirs) is not type(node):
            problems.append("%s.%s: %s's is a %s" % (label, node.name, project,
                                                     type(theirs).__name__))
        elif isinstance(node, ast.ClassDef):
            module = imported[node.name]
            problems += compare_class(label + "." + node.name, tree, module, node, theirs,
                                      "all", stand_ins, project)
        else:
            problems += compare_signatures(label + "." + node.name, node, theirs,
                                           project=project)
    for name, module in sorted(imported.items()):
        if tree.find(module, name)[0] is None:
            problems.append("%s imports %s from %s: %s" % (
                label, name, module, tree.find(module, name)[1]))
    return problems


def check_package(tree):
    """The connector package's own imports from vLLM, and KVEngineConnector's overrides
    of KVConnectorBase_V1."""
    problems = []
    base, why = tree.find("vllm.distributed.kv_transfer.kv_connector.v1.base",
                          "KVConnectorBase_V1")
    if base is None:
        return [why]
    base_members = all_members(tree, "vllm.distributed.kv_transfer.kv_connector.v1.base", base)
    for fname in sorted(os.listdir(PACKAGE)):
        if not fname.endswith(".py") or fname == "_vllm_compat.py":
            continue
        path = os.path.join(PACKAGE, fname)
        module = ast.parse(open(path).read(), path)
        for node in ast.walk(module):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] == "vllm":
                for alias in node.names:
                    found, why = tree.find(node.module, alias.name)
                    if found is None:
                        problems.append("%s imports %s: %s" % (fname, alias.name, why))
            if isinstance(node, ast.ClassDef) and node.name == "KVEngineConnector":
                for name, (kind, fn) in sorted(members(node).items()):
                    if name in base_members and name != "__init__" and \
                            base_members[name][0] not in ("field", "attribute"):
                        their_kind, their_fn = base_members[name]
                        where = "KVEngineConnector.%s" % name
                        if kind != their_kind:
                            problems.append("%s is a %s; KVConnectorBase_V1's is a %s" % (
                                where, kind, their_kind))
                        else:
                            problems += compare_signatures(where, fn, their_fn,
                                                           allow_extra_optional=True)
    return problems


def check_fakes(tree, fakes_path=FAKES, fake_classes=None, project="vLLM", stand_ins=None):
    """The fakes module's classes listed in fake_classes (default FAKE_CLASSES: the vLLM
    fakes) against the project's."""
    problems = []
    label = os.path.splitext(os.path.basename(fakes_path))[0]
    fakes = ast.parse(open(fakes_path).read(), fakes_path)
    classes = {n.name: n for n in fakes.body if isinstance(n, ast.ClassDef)}
    for ours, module, theirs_name, coverage in fake_classes or FAKE_CLASSES:
        if ours not in classes:
            problems.append("%s.%s: listed in FAKE_CLASSES but not defined" % (label, ours))
            continue
        theirs, why = tree.find(module, theirs_name)
        if theirs is None:
            problems.append("%s.%s: %s" % (label, ours, why))
            continue
        problems += compare_class(label + "." + ours, tree, module, classes[ours], theirs,
                                  coverage, stand_ins, project)
    return problems


def find_tree(explicit):
    for candidate in (explicit, os.environ.get("VLLM_SOURCE_DIR")):
        if candidate:
            if not os.path.isdir(os.path.join(candidate, "vllm")):
                raise SystemExit("%s: no vllm/ package inside" % candidate)
            return candidate
    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.origin:
        return os.path.dirname(os.path.dirname(spec.origin))
    return None


def run(src, parts=("compat", "package", "fakes")):
    tree = Tree(src)
    problems = []
    if "compat" in parts:
        problems += check_compat(tree)
    if "package" in parts:
        problems += check_package(tree)
    if "fakes" in parts:
        problems += check_fakes(tree)
    return problems


def cli(argv, doc, name, project, src_help, find, run_parts, parts="compat,package,fakes"):
    """The command line the conformance scripts share: the source tree as an argument (or
    --<project>-src), --only, a line per problem, exit 0 / 1, or 77 (skipped) without a
    tree."""
    flag = "--%s-src" % project.lower()
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("source_tree", nargs="?", metavar="SOURCE_TREE", help=src_help)
    parser.add_argument(flag, dest="src", help="the same, as an option")
    parser.add_argument("--only", default=parts, help="comma-separated: " + ", ".join(
        parts.split(",")))
    args = parser.parse_args(argv)
    if args.src and args.source_tree and args.src != args.source_tree:
        parser.error("two source trees given: %s and %s" % (args.source_tree, args.src))
    src = find(args.src or args.source_tree)
    if src is None:
        print("%s: skipped: no %s source tree (as an argument, %s or %s_SOURCE_DIR) and no "
              "installed %s" % (
            name, project, flag, project.upper(), project.lower()))
        return SKIPPED
    problems = run_parts(src, args.only.split(","))
    for p in problems:
        print("%s: %s" % (name, p))
    print("%s: %s against %s (%d problem%s)" % (
        name, "FAILED" if problems else "passed", src, len(problems),
        "" if len(problems) == 1 else "s"))
    return 1 if problems else 0


def main(argv=None):
    return cli(argv, __doc__, "vllm_conformance", "vLLM", "a vLLM source tree (holding vllm/)",
               find_tree, run)


if __name__ == "__main__":
    sys.exit(main())
