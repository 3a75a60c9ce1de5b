#!/usr/bin/env bash
# Sets up, builds and runs the default kv_bench suite on embedded DBs in temporary
# directories: the physical baselines (memcpy, O_DIRECT rawwrite/rawread) and the vLLM
# scenarios on kvengine and RocksDB in the same run (--engine=both), at 1 MiB and at
# 64 KiB values.  About a minute on 2 cores with the default 1 GiB memory budget.
#
#   scripts/run_bench.sh                      the default suite
#   scripts/run_bench.sh --value_size=262144  one run of the suite's benchmarks, with
#                                             these kv_bench flags on top
#   scripts/run_bench.sh --benchmarks=fillseq,readrandom --engine=kvengine --num=10000
#
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build_dir" -j "$jobs" --target kv_bench

suite=(
  --benchmarks=memcpy,rawwrite,rawread,vllm_write,vllm_exist,vllm_get,vllm_all
  --engine=both
  --duration=2
  --num_layers=32
)

if [[ $# -gt 0 ]]; then
  exec "$build_dir/kv_bench" "${suite[@]}" "$@"
fi
for value_size in 1048576 65536; do
  echo "=== kv_bench ${suite[*]} --value_size=$value_size"
  "$build_dir/kv_bench" "${suite[@]}" --value_size="$value_size"
  echo
done
