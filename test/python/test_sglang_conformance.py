"""The SGLang conformance check (sglang_conformance.py) against a real SGLang tree when
one is present (SGLANG_SOURCE_DIR, or an installed sglang), and -- everywhere -- proof
that it fails, naming the member, when a member it checks changes on SGLang's side."""
import ast
import os
import re

import pytest

import sglang_conformance as sc
import vllm_conformance as vc


def _real_tree():
    try:
        return sc.find_tree(None)
    except SystemExit:
        return None


REAL_TREE = _real_tree()


@pytest.mark.skipif(REAL_TREE is None,
                    reason="skipped: no SGLang source tree (set SGLANG_SOURCE_DIR to an "
                           "SGLang checkout, see docs/sglang.md) and no installed sglang")
def test_stand_ins_conform_to_sglang():
    problems = sc.run(REAL_TREE)
    assert problems == [], "\n".join(problems)


def _dedented(source, node):
    lines = ast.get_source_segment(source, node, padded=True).split("\n")
    indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
    return "\n".join(l[indent:] for l in lines) + "\n\n"


def _synthetic_tree(root):
    """A tree holding, at SGLang's module paths, the stand-ins' and fakes' own
    definitions (each module importing the others' classes, for their bases): what the
    check must find conforming before one member is changed."""
    imported, defined = vc.compat_stand_ins(sc.COMPAT, "sglang")
    placed = {}  # module -> [source]
    compat_source = open(sc.COMPAT).read()
    for node in defined:
        placed.setdefault(imported[node.name], []).append(_dedented(compat_source, node))
    fakes_source = open(sc.FAKES).read()
    fakes = {}
    for n in ast.parse(fakes_source).body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef)):
            fakes[n.name] = n
        elif isinstance(n, ast.Assign):
            fakes.update({t.id: n for t in n.targets if isinstance(t, ast.Name)})
    where = {ours: module for ours, module, _, _ in sc.FAKE_CLASSES}
    where.update({ours: module for ours, module, _ in sc.FAKE_FUNCTIONS})
    where.update({name: module for name, module in sc.FAKE_CONSTANTS})
    # A fake named apart from SGLang's class (HybridStorageOperation for the hybrid
    # controller's StorageOperation) takes SGLang's name in its module.
    renamed = {ours: theirs for ours, _, theirs, _ in sc.FAKE_CLASSES if ours != theirs}
    for name, module in where.items():
        text = _dedented(fakes_source, fakes[name])
        for ours, theirs in renamed.items():
            if where[ours] == module:
                text = re.sub(r"\b%s\b" % ours, theirs, text)
        placed.setdefault(module, []).append(text)
    every = dict(where, **imported)
    for module, parts in placed.items():
        path = os.path.join(root, *module.split(".")) + ".py"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            for name, home in sorted(every.items()):
                if home != module:
                    f.write("from %s import %s\n" % (home, name))
            f.write("\n" + "".join(parts))


def _rewrite(path, old, new):
    text = open(path).read()
    assert old in text, (path, old)
    open(path, "w").write(text.replace(old, new, 1))


def test_the_check_names_a_changed_member_everywhere(tmp_path):
    """Runs in every CI: the check passes on a tree made of the stand-ins themselves and
    fails, naming the member, once SGLang's side renames a method, changes a default,
    renames a parameter or changes a constant."""
    root = str(tmp_path)
    _synthetic_tree(root)
    assert sc.run(root) == []
    mem = os.path.join(root, "sglang", "srt", "mem_cache")
    _rewrite(os.path.join(mem, "hicache_storage.py"), "def batch_exists(",
             "def batch_exists_prefix(")
    _rewrite(os.path.join(mem, "hicache_storage.py"), "STORAGE_BATCH_SIZE = 128",
             "STORAGE_BATCH_SIZE = 64")
    _rewrite(os.path.join(mem, "pool_host", "mha.py"), "def get_page_buffer_meta(self, indices)",
             "def get_page_buffer_meta(self, host_indices)")
    _rewrite(os.path.join(root, "sglang", "srt", "managers", "cache_controller.py"),
             'write_policy: str = "write_through_selective"', 'write_policy: str = "write_back"')
    # The v2 interface: an enum value and a dataclass field default.
    _rewrite(os.path.join(mem, "hicache_storage.py"), 'INDEXER = "indexer"',
             'INDEXER = "dsa_indexer"')
    _rewrite(os.path.join(mem, "hicache_storage.py"),
             "hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES\n    nodes_to_load",
             "hit_policy: PoolHitPolicy = PoolHitPolicy.TRAILING_PAGES\n    nodes_to_load")
    problems = "\n".join(sc.run(root))
    assert "_sglang_compat.HiCacheStorage.batch_exists: SGLang's HiCacheStorage has no " \
        "member" in problems, problems
    assert "sglang_fakes.MHATokenToKVPoolHost.get_page_buffer_meta takes (self, indices)" \
        in problems, problems
    assert "sglang_fakes.HiCacheController.__init__: parameter write_policy defaults to " \
        "'write_through_selective'" in problems, problems
    assert "sglang_fakes.STORAGE_BATCH_SIZE = 128; SGLang's is 64" in problems, problems
    assert "_sglang_compat.PoolName.INDEXER = 'indexer'; SGLang's is 'dsa_indexer'" \
        in problems, problems
    assert "_sglang_compat.PoolTransfer.hit_policy: default PoolHitPolicy.ALL_PAGES; " \
        "SGLang's PoolHitPolicy.TRAILING_PAGES" in problems, problems
