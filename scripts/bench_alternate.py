#!/usr/bin/python3
"""Runs kv_bench in several modes, alternated round after round on the same machine, and
prints each benchmark's ops/sec per mode (the median over rounds) and its ratio to the
first mode: the same-run A/B that docs/benchmarks.md and docs/observability.md quote.

  scripts/bench_alternate.py --rounds=4 \\
      --common="--benchmarks=vllm_write,vllm_get --value_size=65536 --duration=2" \\
      off="--options=perf_level=off" entry="--options=perf_level=entry"

Each mode is NAME="extra kv_bench arguments".  kv_bench is build/kv_bench unless
--kv_bench says otherwise.
"""
import argparse
import re
import shlex
import statistics
import subprocess
import sys

LINE = re.compile(r"^(\S+)\s*:\s*([\d.]+) micros/op\s+(\d+) ops/sec")


def run(kv_bench, common, extra):
    out = subprocess.run([kv_bench] + shlex.split(common) + shlex.split(extra),
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        sys.exit("kv_bench failed (%d):\n%s%s" % (out.returncode, out.stdout, out.stderr))
    figures = {}
    for line in out.stdout.splitlines():
        m = LINE.match(line)
        if m:
            figures[m.group(1)] = int(m.group(3))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--common", default="")
    parser.add_argument("--kv_bench", default="build/kv_bench")
    parser.add_argument("modes", nargs="+", help='NAME="kv_bench arguments"')
    args = parser.parse_args()
    modes = [m.split("=", 1) if "=" in m else (m, "") for m in args.modes]
    ops = {name: {} for name, _ in modes}  # mode -> benchmark -> [ops/sec per round]
    for r in range(args.rounds):
        for name, extra in modes:
            for bench, value in run(args.kv_bench, args.common, extra).items():
                ops[name].setdefault(bench, []).append(value)
                print("round %d %-10s %-22s %10d ops/sec" % (r + 1, name, bench, value),
                      flush=True)
    base = modes[0][0]
    print("\n%-22s %s" % ("benchmark", "  ".join("%14s" % n for n, _ in modes)))
    for bench in ops[base]:
        medians = [statistics.median(ops[n].get(bench, [0])) for n, _ in modes]
        cells = ["%8d %5.2f" % (m, m / medians[0] if medians[0] else 0) for m in medians]
        print("%-22s %s" % (bench, "  ".join(cells)))
    print("(median ops/sec over %d rounds, and its ratio to %s)" % (args.rounds, base))


if __name__ == "__main__":
    main()
