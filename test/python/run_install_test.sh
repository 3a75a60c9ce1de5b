#!/usr/bin/env bash
# Installs the built tree into a scratch prefix and uses the installed Python package.
set -euo pipefail
build_dir=$1 work=$2 python=$3 pydir=$4
rm -rf "$work" && mkdir -p "$work"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cd "$work"  # not the source tree: the installed package must be the one imported
PYTHONPATH="$work/prefix/$pydir" "$python" - "$work/db" "$work/prefix/$pydir" <<'PY'
import sys
import kvengine
assert kvengine.__file__.startswith(sys.argv[2]), kvengine.__file__
import kvengine.vllm.connector  # the connector module loads without vLLM
import kvengine.sglang  # the SGLang backend loads without SGLang
with kvengine.open(sys.argv[1], memory_capacity_bytes="16MiB", prefault_memory=False) as db:
    assert db.put("k", b"v" * 100) == 0
    assert db.get("k") == b"v" * 100
print("python install test: OK")
PY
