"""The vLLM conformance check (vllm_conformance.py) against a real vLLM tree when one is
present (VLLM_SOURCE_DIR, or an installed vllm), and -- everywhere -- proof that it
fails, naming the member, when a member it checks is renamed or removed."""
import ast
import importlib.util
import os
import shutil
import subprocess
import sys
from unittest import mock

import pytest

import vllm_conformance as vc


def _real_tree():
    try:
        return vc.find_tree(None)
    except SystemExit:
        return None


REAL_TREE = _real_tree()
needs_tree = pytest.mark.skipif(
    REAL_TREE is None,
    reason="skipped: no vLLM source tree (set VLLM_SOURCE_DIR to a vLLM checkout, see "
           "docs/vllm.md) and no installed vllm")


@needs_tree
def test_stand_ins_conform_to_vllm():
    problems = vc.run(REAL_TREE)
    assert problems == [], "\n".join(problems)


def _copy_checked_modules(src, dst):
    """The modules the check reads (every one it looked up, re-exports included), copied
    into a tree of their own."""
    read = set()
    path_of = vc.Tree.path_of

    def recording(self, module):
        path = path_of(self, module)
        if path is not None:
            read.add(os.path.relpath(path, self.src))
        return path

    with mock.patch.object(vc.Tree, "path_of", recording):
        vc.run(src)
    assert "vllm/distributed/kv_transfer/kv_connector/v1/base.py" in read, read
    for rel in read:
        os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
        shutil.copy(os.path.join(src, rel), os.path.join(dst, rel))


def _rewrite(path, old, new):
    text = open(path).read()
    assert old in text, (path, old)
    open(path, "w").write(text.replace(old, new, 1))


@needs_tree
def test_a_renamed_or_removed_member_of_real_vllm_is_named(tmp_path):
    _copy_checked_modules(REAL_TREE, str(tmp_path))
    assert vc.run(str(tmp_path)) == []
    base = tmp_path / "vllm/distributed/kv_transfer/kv_connector/v1/base.py"
    _rewrite(str(base), "def build_prom_metrics(", "def build_prom_metrics_renamed(")
    utils = tmp_path / "vllm/v1/metrics/utils.py"
    _rewrite(str(utils), "def create_metric_per_engine(", "def create_metric_per_engine_gone(")
    problems = "\n".join(vc.run(str(tmp_path)))
    assert "_vllm_compat.KVConnectorBase_V1.build_prom_metrics" in problems, problems
    assert "create_metric_per_engine" in problems, problems


def _synthetic_tree(root):
    """A tree holding, at vLLM's module paths, the stand-ins' own definitions: what the
    check must find conforming, before one member is changed."""
    imported, defined = vc.compat_stand_ins()
    source = open(vc.COMPAT).read()
    by_module = {}
    for node in defined:
        by_module.setdefault(imported[node.name], []).append(node)
    for module, nodes in by_module.items():
        path = os.path.join(root, *module.split(".")) + ".py"
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            for node in nodes:
                segment = ast.get_source_segment(source, node, padded=True)
                # Dedent: the stand-ins sit inside the except branch.
                lines = segment.split("\n")
                indent = min(len(l) - len(l.lstrip()) for l in lines if l.strip())
                f.write("\n".join(l[indent:] for l in lines) + "\n\n")
    return by_module


def test_the_check_names_a_renamed_member_everywhere(tmp_path):
    """Runs in every CI: the check passes on a tree made of the stand-ins themselves and
    fails, naming the member, once vLLM's side renames a method, drops a function or
    changes a parameter."""
    root = str(tmp_path)
    _synthetic_tree(root)
    assert vc.run(root, ["compat"]) == []
    base = os.path.join(root, "vllm/distributed/kv_transfer/kv_connector/v1/base.py")
    _rewrite(base, "def requires_piecewise_for_cudagraph(cls, extra_config",
             "def requires_piecewise_for_cudagraph(cls, config")
    _rewrite(base, "def get_finished_count(", "def get_finished_total(")
    utils = os.path.join(root, "vllm/v1/metrics/utils.py")
    _rewrite(utils, "def create_metric_per_engine(", "def make_metric_per_engine(")
    events = os.path.join(root, "vllm/distributed/kv_events.py")
    _rewrite(events, "def get_common_events(", "def get_shared_events(")
    _rewrite(events, "    group_idx: Optional[int] = None\n\n    def __hash__(self) -> int:\n"
             "        return hash((tuple(self.block_hashes), self.medium",
             "    group_idx: Optional[int] = 0\n\n    def __hash__(self) -> int:\n"
             "        return hash((tuple(self.block_hashes), self.medium")
    problems = "\n".join(vc.run(root, ["compat"]))
    assert "KVEventAggregator.get_common_events: vLLM's KVEventAggregator has no member" \
        in problems, problems
    assert "BlockRemoved.group_idx: default None; vLLM's 0" in problems, problems
    assert "KVConnectorBase_V1.get_finished_count: vLLM's KVConnectorBase_V1 has no member" \
        in problems, problems
    assert "KVConnectorBase_V1.requires_piecewise_for_cudagraph takes (cls, extra_config)" \
        in problems, problems
    assert "_vllm_compat.create_metric_per_engine" in problems, problems


def test_a_drifted_stand_in_is_named(tmp_path):
    """Runs in every CI: the other direction -- vLLM unchanged, the stand-in drifted (a
    parameter added, a member vLLM lacks, a default changed)."""
    root = str(tmp_path / "tree")
    _synthetic_tree(root)
    drifted = str(tmp_path / "_vllm_compat.py")
    shutil.copy(vc.COMPAT, drifted)
    _rewrite(drifted, "def finish_forward(self) -> None:",
             "def finish_forward(self, step=None) -> None:")
    _rewrite(drifted, "        def has_pending_block_frees(self) -> bool:",
             "        def has_pending_frees(self) -> bool:")
    _rewrite(drifted, "def get_transfer_results(self, finished_req_ids: set)",
             "def get_transfer_results(self, finished_req_ids: set = frozenset())")
    problems = "\n".join(vc.check_compat(vc.Tree(root), compat=drifted))
    assert "KVConnectorBase_V1.finish_forward takes (self, step)" in problems, problems
    assert "KVConnectorBase_V1.has_pending_frees: vLLM's KVConnectorBase_V1 has no member" \
        in problems, problems
    assert "KVConnectorBase_V1.has_pending_block_frees: vLLM's KVConnectorBase_V1 has it" \
        in problems, problems
    assert "get_transfer_results: parameter finished_req_ids has a default" in problems, \
        problems


def test_the_script_takes_the_tree_by_path(tmp_path):
    """scripts/check_vllm_conformance.py DIR: 0 on a conforming tree, 1 naming the member
    once it drifts (the same with --vllm-src DIR), an error for a directory without vllm/,
    77 without any tree."""
    root = str(tmp_path / "tree")
    _synthetic_tree(root)
    script = os.path.join(vc.ROOT, "scripts", "check_vllm_conformance.py")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SOURCE_DIR"}

    def check(*args):
        return subprocess.run([sys.executable, script, *args], capture_output=True,
                              text=True, env=env)

    r = check(root, "--only", "compat")
    assert r.returncode == 0 and "passed against " + root in r.stdout, r.stdout + r.stderr
    _rewrite(os.path.join(root, "vllm/distributed/kv_transfer/kv_connector/v1/base.py"),
             "def get_finished_count(", "def get_finished_total(")
    for args in ([root], ["--vllm-src", root]):
        r = check(*args, "--only", "compat")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "KVConnectorBase_V1.get_finished_count: vLLM's KVConnectorBase_V1 has no " \
            "member" in r.stdout and "FAILED against " + root in r.stdout, r.stdout
    r = check(str(tmp_path))  # no vllm/ inside
    assert r.returncode == 1 and "no vllm/ package inside" in r.stderr, r.stdout + r.stderr
    if importlib.util.find_spec("vllm") is None:  # no installed vllm to fall back on
        r = check()
        assert r.returncode == vc.SKIPPED and "skipped" in r.stdout, r.stdout + r.stderr
