#!/usr/bin/env bash
# Builds kvengine with CUDA and runs the GPU tests and the GPU benchmark.  For a machine
# with an NVIDIA GPU, its driver and the CUDA Toolkit (and the packages of
# scripts/bootstrap.sh already installed; this script downloads nothing).
#   test/gpu/run.sh [figures-file]      default: $BUILD_DIR/gpu_bench.txt
# Environment: BUILD_DIR (default build-gpu), JOBS (default: number of cores),
#              GPU_BENCH_ARGS (extra arguments for gpu_bench, e.g. "--batches 20").
set -euo pipefail
cd "$(dirname "$0")/../.."
build_dir=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
figures=${1:-$build_dir/gpu_bench.txt}

if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L
else
  echo "run.sh: nvidia-smi not found; the tests below fail if no GPU is usable" >&2
fi

# KV_BUILD_TOOLS=OFF: only the library, the tests and the GPU benchmark are needed.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKV_WITH_CUDA=ON \
  -DKV_BUILD_TOOLS=OFF >/dev/null
cmake --build "$build_dir" -j "$jobs" --target gpu_staging_test gpu_test gpu_bench _kvengine

tmp_dir="$build_dir/test/tmp"
mkdir -p "$tmp_dir"

# The pipeline's logic (host copier) and the DB's GPU routing, then the device tests.
# KV_GPU_REQUIRED=1 turns "no GPU" into a failure instead of a skip.
KV_TEST_TMPDIR="$tmp_dir" "$build_dir/test/gpu_staging_test" --gtest_brief=1
KV_GPU_REQUIRED=1 KV_TEST_TMPDIR="$tmp_dir" "$build_dir/test/gpu/gpu_test" --gtest_brief=1

mkdir -p "$(dirname "$figures")"
# shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of arguments
KV_TEST_TMPDIR="$tmp_dir" "$build_dir/test/gpu/gpu_bench" --out "$figures" ${GPU_BENCH_ARGS:-}
echo "run.sh: figures written to $figures"

# The vLLM connector's round trip on CUDA caches.  It needs a torch built with CUDA
# (Debian's python3-torch is CPU-only): exit 77 says it was skipped, and why.
rc=0
PYTHONPATH="$build_dir/python:test/python" PYTHONHASHSEED=0 /usr/bin/python3 \
  test/gpu/connector_gpu.py >>"$figures" || rc=$?
tail -n 8 "$figures"
[[ $rc -eq 0 || $rc -eq 77 ]] || exit "$rc"
