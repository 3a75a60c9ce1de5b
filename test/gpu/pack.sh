#!/usr/bin/env bash
# Packs the GPU tests and benchmarks, built on this machine, with the shared libraries
# they load (all but the C and C++ runtimes), into one folder that runs on a GPU host
# where this project's packages cannot be installed (no package registry there; the
# host needs only the NVIDIA driver).  The CUDA Toolkit is needed here, not there.
#   test/gpu/pack.sh DIR          builds build-gpu/ (and build/ for kv_bench), fills DIR
#   DIR/run.sh [OUT_DIR]          on the GPU host: the tests, then gpu_bench's figures
# run.sh runs what test/gpu/run.sh runs, minus the Python connector test (its module is
# built for this machine's Python).  Extra kv_bench runs go after it in the same call.
# Environment: JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
[[ $# -eq 1 ]] || { echo "usage: test/gpu/pack.sh DIR" >&2; exit 1; }
pack=$1
jobs=${JOBS:-$(nproc)}

cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKV_WITH_CUDA=ON \
  -DKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build-gpu -j "$jobs" --target gpu_staging_test gpu_test gpu_bench
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$jobs" --target kv_bench

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/lib" "$pack/lib-cxx"
cp build-gpu/test/gpu_staging_test build-gpu/test/gpu/gpu_test build-gpu/test/gpu/gpu_bench \
  build/kv_bench "$pack/bin/"
# The C library's own objects stay: the host's are as new or newer.  The C++ runtime
# goes to lib-cxx, used only where the host's is too old for these binaries.
for lib in $(ldd "$pack"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case $(basename "$lib") in
    libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;;
    libstdc++.so.* | libgcc_s.so.*) cp -L "$lib" "$pack/lib-cxx/" ;;
    *) cp -L "$lib" "$pack/lib/" ;;
  esac
done

cat >"$pack/run.sh" <<'EOF'
#!/usr/bin/env bash
# The GPU tests and gpu_bench from binaries packed by test/gpu/pack.sh.
#   run.sh [OUT_DIR]      figures in OUT_DIR/gpu_bench.txt (default: ./gpu-out)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-gpu-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$here/lib
if ldd "$here"/bin/* 2>&1 | grep -q "not found"; then
  export LD_LIBRARY_PATH=$here/lib:$here/lib-cxx  # the host's C++ runtime is older
fi
ldd "$here"/bin/* 2>&1 | grep "not found" && echo "run.sh: libraries missing" >&2
nvidia-smi -L || true
tmp=$(mktemp -d)
rc=0
KV_TEST_TMPDIR=$tmp "$here/bin/gpu_staging_test" --gtest_brief=1 || rc=1
KV_GPU_REQUIRED=1 KV_TEST_TMPDIR=$tmp "$here/bin/gpu_test" --gtest_brief=1 || rc=1
# shellcheck disable=SC2086  # GPU_BENCH_ARGS is a list of arguments
KV_TEST_TMPDIR=$tmp "$here/bin/gpu_bench" --out "$out/gpu_bench.txt" ${GPU_BENCH_ARGS:-} || rc=1
rm -rf "$tmp"
exit $rc
EOF
chmod +x "$pack/run.sh"
du -sh "$pack"
