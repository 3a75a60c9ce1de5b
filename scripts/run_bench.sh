#!/usr/bin/env bash
# Sets up, builds and runs the default kv_bench suite on an embedded DB in a temporary
# directory.  Extra arguments go to kv_bench.
#   scripts/run_bench.sh [--value_size=65536 ...]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$(nproc)" --target kv_bench
"$build_dir/kv_bench" --benchmarks=memcpy,batchput,batchget,batchexists "$@"
