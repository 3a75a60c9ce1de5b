#!/usr/bin/env bash
# Installs the built kvengine into a scratch prefix and builds a small user program
# against it twice: through find_package(kvengine) and through pkg-config.
set -euo pipefail
build_dir=$1 work=$2 src=$3
rm -rf "$work" && mkdir -p "$work"
prefix="$work/prefix"
cmake --install "$build_dir" --prefix "$prefix" >/dev/null

# 1. CMake package
cmake -S "$src/consumer" -B "$work/cmake_build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/cmake_build" >/dev/null
"$work/cmake_build/consumer" "$work/db_cmake"

# 2. pkg-config
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig:$prefix/lib64/pkgconfig:$prefix/lib/x86_64-linux-gnu/pkgconfig"
g++ -o "$work/consumer_pc" "$src/consumer/main.cc" $(pkg-config --cflags --libs kvengine)
"$work/consumer_pc" "$work/db_pc"
echo "install package test: OK"
