#!/usr/bin/env bash
# Builds and runs the libFuzzer targets of test/fuzz (docs/fuzzing.md).
#   test/fuzz/run_fuzz.sh build BUILD_DIR         configure and build them with clang
#   test/fuzz/run_fuzz.sh run BUILD_DIR TARGET    replay its regression inputs, then fuzz it
#   test/fuzz/run_fuzz.sh all [BUILD_DIR]         build, then run every target
#   test/fuzz/run_fuzz.sh seeds [BUILD_DIR]       rewrite corpus/ with the project's writers
# BUILD_DIR defaults to build/fuzz.  TARGET is a file name *_fuzzer.cc without the suffix.
# Environment:
#   KV_FUZZ_SECONDS  how long each target fuzzes (default 10; the long mode is e.g. 600)
#   KV_FUZZ_CXX      the clang++ to build with (default clang++)
#   KV_FUZZ_JOBS     build parallelism (default 2)
# Exits 77 (CTest's skip code) when clang++ or libFuzzer is missing, saying so.
set -euo pipefail

src=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$src/../.." && pwd)
seconds=${KV_FUZZ_SECONDS:-10}
cxx=${KV_FUZZ_CXX:-clang++}

skip() {
  echo "SKIP: $*"
  exit 77
}

targets() {
  local f
  for f in "$src"/*_fuzzer.cc; do
    f=${f##*/}
    echo "${f%_fuzzer.cc}"
  done
}

build() {
  local dir=$1
  command -v "$cxx" >/dev/null ||
    skip "$cxx not found: the fuzz targets need clang (scripts/bootstrap.sh installs it)"
  mkdir -p "$dir"
  # libFuzzer ships apart from clang on Debian (libclang-rt-*-dev).
  if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
    "$cxx" -x c++ -fsanitize=fuzzer,address,undefined - -o "$dir/probe" 2>"$dir/probe.log"; then
    cat "$dir/probe.log"
    skip "$cxx cannot link libFuzzer: install libclang-rt-14-dev (scripts/bootstrap.sh does)"
  fi
  local args=(-S "$src" -B "$dir" -DCMAKE_CXX_COMPILER="$cxx")
  command -v ninja >/dev/null && args+=(-G Ninja)
  command -v ccache >/dev/null && args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  cmake "${args[@]}" >/dev/null
  cmake --build "$dir" -j "${KV_FUZZ_JOBS:-2}"
}

run() {
  local dir=$1 target=$2
  local bin="$dir/${target}_fuzzer"
  [[ -x "$bin" ]] || skip "$bin is not built (see the fuzz_build test, or: $0 build $dir)"
  local corpus="$src/corpus/$target" regressions="$src/regressions/$target"
  local work="$dir/work/$target"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  local flags=(-rss_limit_mb=2560 -timeout=10 -artifact_prefix="$work/artifacts/")

  # Every input that once crashed a target, once each: the regression tests.
  local inputs=()
  [[ -d "$regressions" ]] && mapfile -t inputs < <(find "$regressions" -type f | sort)
  if ((${#inputs[@]} > 0)); then
    echo "== $target: replaying ${#inputs[@]} regression inputs"
    "$bin" "${flags[@]}" "${inputs[@]}" >"$work/replay.log" 2>&1 || {
      tail -n 80 "$work/replay.log"
      failed "$target" "$work" "$bin"
    }
  fi

  # New inputs go to the scratch corpus (first directory), never into the source tree.
  echo "== $target: fuzzing for $seconds s"
  local dirs=("$work/corpus" "$corpus")
  [[ -d "$regressions" ]] && dirs+=("$regressions")
  timeout --kill-after=10 $((seconds + 120)) \
    "$bin" "${flags[@]}" -max_total_time="$seconds" -print_final_stats=1 "${dirs[@]}" \
    >"$work/log" 2>&1 || {
    tail -n 80 "$work/log"
    failed "$target" "$work" "$bin"
  }
  grep -E "^Done|DONE|stat::number_of_executed_units" "$work/log" || true
}

failed() {
  local target=$1 work=$2 bin=$3 a
  echo "FAILED: the $target fuzz target found an input that breaks it."
  for a in "$work"/artifacts/*; do
    [[ -e "$a" ]] || continue
    echo "  input:     $a"
    echo "  reproduce: $bin $a"
    echo "  keep it:   cp $a $src/regressions/$target/<what-it-breaks>  (once fixed)"
  done
  exit 1
}

mode=${1:-}
case "$mode" in
  build) build "${2:?usage: $0 build BUILD_DIR}" ;;
  run) run "${2:?usage: $0 run BUILD_DIR TARGET}" "${3:?usage: $0 run BUILD_DIR TARGET}" ;;
  all)
    dir=${2:-$root/build/fuzz}
    build "$dir"
    for t in $(targets); do run "$dir" "$t"; done
    ;;
  seeds)
    dir=${2:-$root/build/fuzz}
    build "$dir"
    "$dir/make_fuzz_seeds" "$src/corpus"
    echo "rewrote $src/corpus"
    ;;
  *)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
