#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment, offline, then the Python tests against
# the installed package (issue 49; docs/python.md, "pip").
#   run_pip_test.sh SOURCE_DIR WORK_DIR PYTHON CMAKE_BUILD_DIR [PREBUILT_MODULE]
# With PREBUILT_MODULE (CTest's default) setup.py packs the build's own _kvengine module
# instead of compiling the library again (minutes on a loaded 2-core machine); set
# KV_PIP_TEST_FULL_BUILD=1 to have pip run the CMake build too.
# --system-site-packages: the venv sees Debian's setuptools and wheel (the build backend)
# and torch (the tests'); nothing comes from PyPI (--no-index, --no-build-isolation).
set -euo pipefail
src=$1 work=$2 python=$3 build_dir=$4 prebuilt=${5:-}
if [ "${KV_PIP_TEST_FULL_BUILD:-0}" != 0 ]; then prebuilt=""; fi
rm -rf "$work" && mkdir -p "$work"
"$python" -m venv --system-site-packages "$work/venv"
venv_python="$work/venv/bin/python"
KVENGINE_PREBUILT_MODULE="$prebuilt" KVENGINE_BUILD_DIR="$build_dir" PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
  "$venv_python" -m pip install --no-build-isolation --no-deps -q "$src"
cd "$work"  # not the source tree: the installed package must be the one imported
"$venv_python" - "$work/venv" "$work/db" <<'PY'
import sys
import kvengine
assert kvengine.__file__.startswith(sys.argv[1]), kvengine.__file__
import kvengine.vllm.connector  # the connector module loads without vLLM
import kvengine.sglang  # the SGLang backend loads without SGLang
import kvengine.lmcache  # the LMCache plug-in loads without LMCache
with kvengine.open(sys.argv[2], memory_capacity_bytes="16MiB", prefault_memory=False) as db:
    assert db.put("k", b"v" * 100) == 0
    assert db.get("k") == b"v" * 100
print("pip install into a venv: OK,", kvengine.__file__)
PY
# The Python tests, against the venv's package (conftest.py adds the build tree only when
# no kvengine is importable).
KV_TEST_TMPDIR="$work/tmp" PYTHONDONTWRITEBYTECODE=1 \
  "$venv_python" -m pytest -q -p no:cacheprovider "$src/test/python"
"$venv_python" -m pip uninstall -y -q kvengine
! "$venv_python" -c 'import kvengine' 2>/dev/null
echo "pip uninstall: OK"
