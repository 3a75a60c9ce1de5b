#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite (C++ through CTest, Python through pytest).
#   scripts/run_tests.sh
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# Locking checked by the compiler: clang -Wthread-safety -Werror, syntax only, over every
# library and tool source (about 80 s on 2 cores).
scripts/check_thread_safety.py "$build_dir" "$jobs"
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" -j "$jobs" --output-on-failure --timeout 600
