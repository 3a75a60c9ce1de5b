#!/usr/bin/env python3
"""Python vs C++ bandwidth of the multi-buffer batch calls, in the same run.

    PYTHONPATH=build/python /usr/bin/python3 python/bench/bench_batch.py [--keys 64]
        [--value-size 1MiB-as-bytes] [--parts 2] [--iterations 20]

For each of put and get it times batch_put_from_multi_buffers /
batch_get_into_multi_buffers called from Python, then the very same batch run in a C++
loop inside the module (DB::BatchPut / DB::BatchGetInto with no Python in between), and
prints both bandwidths and their ratio.  The target is Python >= 90% of C++.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

import kvengine


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=64)
    ap.add_argument("--value-size", type=int, default=1 << 20)
    ap.add_argument("--parts", type=int, default=2, help="buffers per value (K and V)")
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--path", default=None)
    args = ap.parse_args()

    path = args.path or tempfile.mkdtemp(prefix="kv_pybench_")
    total = args.keys * args.value_size
    cap = max(4 * total, 64 << 20)
    part = args.value_size // args.parts
    buf = np.random.default_rng(0).integers(0, 255, (args.keys, args.parts, part), np.uint8)
    keys = ["bench/%06d" % i for i in range(args.keys)]
    ptrs = [[buf[k, p].ctypes.data for p in range(args.parts)] for k in range(args.keys)]
    sizes = [[part] * args.parts for _ in range(args.keys)]
    nbytes = args.keys * args.parts * part
    failures = 0
    try:
        with kvengine.open(path, memory_capacity_bytes=cap, apply_environment=False) as db:
            for op in ("put", "get"):
                call = (db.batch_put_from_multi_buffers if op == "put"
                        else db.batch_get_into_multi_buffers)
                expect = 0 if op == "put" else args.value_size // args.parts * args.parts
                assert call(keys, ptrs, sizes) == [expect] * args.keys  # warm up
                best_py = best_cpp = float("inf")
                for _ in range(3):  # interleaved rounds, best of each
                    t0 = time.perf_counter()
                    for _ in range(args.iterations):
                        res = call(keys, ptrs, sizes)
                    py_s = time.perf_counter() - t0
                    failures += sum(1 for r in res if r != expect)
                    cpp_s = db._cpp_batch_loop(op, keys, ptrs, sizes, args.iterations)
                    best_py, best_cpp = min(best_py, py_s), min(best_cpp, cpp_s)
                py_bw = nbytes * args.iterations / best_py / 1e9
                cpp_bw = nbytes * args.iterations / best_cpp / 1e9
                print("%-4s keys=%d value=%d parts=%d  python %.2f GB/s  c++ %.2f GB/s  "
                      "ratio %.1f%%" % (op, args.keys, args.value_size, args.parts, py_bw,
                                        cpp_bw, 100.0 * py_bw / cpp_bw))
    finally:
        if args.path is None:
            shutil.rmtree(path, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
