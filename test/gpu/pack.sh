#!/usr/bin/env bash
# Packs the GPU tests and benchmarks, built on this machine, with the shared libraries
# they load (all but the C and C++ runtimes), into one folder that runs on a GPU host
# where this project's packages cannot be installed (no package registry there; the
# host needs only the NVIDIA driver).  The CUDA Toolkit is needed here, not there.
#   test/gpu/pack.sh DIR          builds build-gpu/ (and build/ for kv_bench), fills DIR
#   DIR/run.sh [OUT_DIR]          on the GPU host: the tests, then gpu_bench's figures
# run.sh runs what test/gpu/run.sh runs.  The Python module is built there, for the host's
# python3, from the source tree the pack lies in (or KV_SOURCE_DIR) and the packed
# library, when that python3 has its headers, pybind11 and g++ (else that test is
# skipped, saying why).  Extra kv_bench runs go after it in the same call.
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
cp build-gpu/libkvengine.a "$pack/"  # plain objects (no LTO): any g++ links them
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

# The vLLM connector on CUDA caches: the module built here for this python3.
src=${KV_SOURCE_DIR:-$here/..}
py=python3
py_inc=$($py -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
pyb_inc=$($py -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null)
ext=$($py -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))' 2>/dev/null)
if [[ ! -f $src/python/src/kvengine_module.cc ]]; then
  echo "run.sh: connector test skipped: no source tree at $src (set KV_SOURCE_DIR)"
elif [[ ! -f $py_inc/Python.h || -z $pyb_inc ]] || ! command -v g++ >/dev/null; then
  echo "run.sh: connector test skipped: $py lacks its headers or pybind11, or g++ is missing"
else
  mkdir -p "$tmp/python"
  cp -r "$src/python/kvengine" "$tmp/python/"
  libs=(-l:libxxhash.so.0 -l:libnuma.so.1 -l:liburing.so.2 -l:libibverbs.so.1 -l:libcurl.so.4
    -l:libcudart.so.13)
  if g++ -O2 -std=c++20 -shared -fPIC -fvisibility=hidden -DKV_WITH_CUDA=1 -DKV_WITH_ETCD=1 \
    -DKV_WITH_RDMA=1 -DKV_WITH_URING=1 -I"$src" -I"$src/include" -isystem "$py_inc" \
    -isystem "$pyb_inc" "$src/python/src/kvengine_module.cc" -o "$tmp/python/kvengine/_kvengine$ext" \
    "$here/libkvengine.a" -L"$here/lib" "${libs[@]}" -Wl,-rpath,"$here/lib"; then
    crc=0
    PYTHONPATH=$tmp/python:$src/test/python PYTHONHASHSEED=0 $py \
      "$src/test/gpu/connector_gpu.py" | tee -a "$out/gpu_bench.txt" || crc=$?
    [[ $crc -eq 0 || $crc -eq 77 ]] || rc=1
  else
    echo "run.sh: the Python module did not build" >&2
    rc=1
  fi
fi
rm -rf "$tmp"
exit $rc
EOF
chmod +x "$pack/run.sh"
du -sh "$pack"
