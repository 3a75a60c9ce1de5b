#!/usr/bin/env python3
"""Smoke tests of kv_bench, run by CTest.

  kv_bench_test.py KV_BENCH {json|text|threads|bad_flags} [--rocksdb]

json:      every benchmark on every engine with tiny sizes and --json; every record must
           parse, carry no errors, and the read benchmarks must have verified their bytes.
text:      db_bench's line format, --histogram and --statistics in text mode.
threads:   several threads over the key-level and vLLM benchmarks, with --duration.
bad_flags: every bad flag exits non-zero with a message naming the flag.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ALL = ("fillseq,fillrandom,overwrite,readrandom,readseq,readmissing,existrandom,"
       "deleterandom,vllm_write,vllm_exist,vllm_get,vllm_all,gc_churn,compact,memcpy,rawwrite,"
       "rawread")
BASELINES = {"memcpy", "memcpy_read", "rawwrite", "rawread"}
TINY = ["--num=48", "--value_size=8192", "--num_layers=4", "--memory=64MiB",
        "--progress_interval=0"]
LINE = re.compile(r"^(\S+)\s+:\s+([0-9.]+) micros/op (\d+) ops/sec ([0-9.]+) seconds "
                  r"(\d+) operations;( +[0-9.]+ MB/s)?( .*)?$")

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(binary, args, timeout=60):
    p = subprocess.run([binary] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def records(stdout):
    out = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            check(False, f"stdout line is not JSON ({e}): {line!r}")
    return out


def check_records(recs, engines, benchmarks):
    seen = {(r["benchmark"], r["engine"]) for r in recs if r.get("engine") != "both"}
    for b in benchmarks:
        if b in BASELINES:
            check((b, None) in seen, f"no record for baseline {b}")
            continue
        for e in engines:
            check((b, e) in seen, f"no record for {b} on {e}")
        if len(engines) == 2:
            check(any(r.get("engine") == "both" and r["benchmark"] == b and
                      "ratio_kvengine_over_rocksdb" in r for r in recs),
                  f"no ratio record for {b}")
    for r in recs:
        if r.get("engine") == "both":
            continue
        name = f"{r['benchmark']}[{r['engine']}]"
        check(r["errors"] == 0, f"{name}: {r['errors']} errors: {r.get('first_error')}")
        check(r["operations"] > 0, f"{name}: no operations")
        check(r["seconds"] >= 0 and r["micros_per_op"] >= 0, f"{name}: negative time")
        b = r["benchmark"]
        if b in ("readrandom", "readseq", "vllm_get", "vllm_all"):
            check(r["verified"] > 0, f"{name}: no value verified")
            check(r["found"] == r["lookups"], f"{name}: found {r['found']} of {r['lookups']}")
            check(r["verified"] == r["found"], f"{name}: verified {r['verified']} of {r['found']}")
        if b in ("vllm_exist", "existrandom") and "found" in r:
            check(r["found"] <= r["lookups"], f"{name}: found more than looked up")
        if b == "vllm_exist":
            check(r["found"] == r["lookups"], f"{name}: found {r['found']} of {r['lookups']}")
        if b == "readmissing":
            check(r["found"] == 0, f"{name}: found {r['found']} missing keys")
        if b == "gc_churn":
            check("reclaimed_bytes" in r, f"{name}: no reclaimed_bytes field")
            check(r["latency_us"]["count"] > 0, f"{name}: no latency samples")
        if b == "compact":
            check(r.get("reclaimed_bytes") is not None, f"{name}: no reclaimed_bytes")


def test_json(binary, engines):
    with tempfile.TemporaryDirectory() as tmp:
        engine = "both" if len(engines) == 2 else engines[0]
        for extra in ([], ["--batch_size=8", "--histogram", f"--db={tmp}/db"]):
            rc, out, err = run(binary, TINY + [f"--benchmarks={ALL}", f"--engine={engine}",
                                               "--json"] + extra)
            check(rc == 0, f"json run {extra} exited {rc}: {err[-2000:]}")
            recs = records(out)
            check_records(recs, engines, ALL.split(",") + ["memcpy_read"])
            if "--histogram" in extra:
                check(all("latency_us" in r for r in recs if r.get("engine") != "both"),
                      "--histogram records lack latency_us")
        # The directory of the second run was wiped at its start and holds only the DB now:
        # a rerun on it works (an earlier kv_bench DB is replaced), --use_existing_db too.
        rc, out, err = run(binary, TINY + ["--benchmarks=fillseq", f"--db={tmp}/db",
                                           "--engine=kvengine", "--json"])
        check(rc == 0, f"rerun on an old DB exited {rc}: {err[-2000:]}")
        check(not [f for f in os.listdir(f"{tmp}/db") if f.startswith("kv_bench_raw")],
              "raw baseline files left in the DB directory")
    # compact on a DB larger than memory: the deleted half is in SSD buckets, and the GC
    # must reclaim it; the rate is set against rawwrite of the same run.
    rc, out, err = run(binary, ["--benchmarks=rawwrite,compact", "--num=48",
                                "--value_size=1048576", "--memory=16MiB", "--engine=kvengine",
                                "--options=bucket_size_limit=4MiB", "--json",
                                "--progress_interval=0"])
    check(rc == 0, f"compact run exited {rc}: {err[-2000:]}")
    compact = [r for r in records(out) if r["benchmark"] == "compact"]
    check(len(compact) == 1, f"no compact record: {out[-2000:]}")
    if compact:
        c = compact[0]
        check(c.get("reclaimed_bytes", 0) >= 4 << 20,
              f"compact reclaimed {c.get('reclaimed_bytes')} bytes of ~24 MiB deleted")
        check(c["bytes"] == c.get("reclaimed_bytes"), "compact: bytes are not the bytes reclaimed")
        check(c.get("vs_rawwrite", 0) > 0, "compact: no ratio against rawwrite")
        check("keys deleted first" in c.get("note", ""), f"compact note: {c.get('note')!r}")


def test_text(binary, engines):
    engine = "both" if len(engines) == 2 else engines[0]
    rc, out, err = run(binary, TINY + ["--benchmarks=memcpy,fillseq,readrandom,vllm_get,gc_churn",
                                       f"--engine={engine}", "--histogram", "--statistics"])
    check(rc == 0, f"text run exited {rc}: {err[-2000:]}")
    lines = [l for l in out.splitlines() if "micros/op" in l]
    check(len(lines) >= 5, f"too few result lines: {lines}")
    for l in lines:
        check(LINE.match(l) is not None, f"not a db_bench line: {l!r}")
    check("Percentiles: P50:" in out and "P99.9:" in out, "no histogram percentiles")
    check("kvengine stats" in out, "no kvengine statistics with --statistics")
    check("foreground read" in out, "gc_churn printed no foreground latency")
    if len(engines) == 2:
        check("kvengine/rocksdb" in out, "no ratio line with --engine=both")
        check("rocksdb.stats" in out or "** DB Stats **" in out, "no RocksDB statistics")


def test_threads(binary, engines):
    engine = "both" if len(engines) == 2 else engines[0]
    rc, out, err = run(binary, TINY + [
        "--benchmarks=fillseq,readrandom,readseq,existrandom,vllm_write,vllm_get,vllm_all,"
        "gc_churn,memcpy,rawread", "--threads=3", "--duration=0.2", "--num=96",
        f"--engine={engine}", "--json"])
    check(rc == 0, f"threads run exited {rc}: {err[-2000:]}")
    recs = [r for r in records(out) if r.get("engine") != "both"]
    check(all(r["threads"] == 3 for r in recs), "a record without threads=3")
    for r in recs:
        check(r["errors"] == 0, f"{r['benchmark']}[{r['engine']}]: errors {r.get('first_error')}")


def test_bad_flags(binary, engines):
    bad = [
        (["--engine=foo"], "--engine"),
        (["--benchmarks=fillseq,nope"], "nope"),
        (["--benchmarks=,"], "--benchmarks"),
        (["--value_size=0"], "--value_size"),
        (["--threads=0"], "--threads"),
        (["--duration=-1"], "--duration"),
        (["--memory=lots"], "--memory"),
        (["--options=no_such_option=1"], "no_such_option"),
        (["--options=memory_eviction=sideways"], "memory_eviction"),
        (["--options=novalue"], "--options"),
        (["--use_existing_db"], "--use_existing_db"),
        (["--num=5", "--batch_size=10"], "--batch_size"),
        (["--num=1000", "--key_size=2"], "--key_size"),
        (["--gc_delete_fraction=1.5"], "--gc_delete_fraction"),
        (["--compact_delete_fraction=-0.1"], "--compact_delete_fraction"),
        (["--gc_delete_fraction=0.6", "--gc_write_fraction=0.6"], "--gc_write_fraction"),
        (["--num=4", "--num_layers=4", "--threads=2", "--benchmarks=vllm_get"], "--threads"),
        (["--no_such_flag=1"], "no_such_flag"),
        (["--num=notanumber"], "num"),
        (["positional"], "positional"),
    ]
    if len(engines) == 2:
        bad.append((["--engine=rocksdb", "--rocksdb_options=bogus_opt=1",
                     "--benchmarks=fillseq"], "rocksdb_options"))
    for args, needle in bad:
        rc, out, err = run(binary, TINY + args)
        check(rc != 0, f"{args} exited 0")
        check(needle in err, f"{args}: message does not name {needle!r}: {err.strip()[:300]!r}")
    with tempfile.TemporaryDirectory() as tmp:
        open(os.path.join(tmp, "precious.txt"), "w").write("mine")
        rc, out, err = run(binary, TINY + ["--benchmarks=fillseq", f"--db={tmp}"])
        check(rc != 0 and "not empty" in err, f"a non-DB directory was accepted: {err[:300]!r}")
        check(os.path.exists(os.path.join(tmp, "precious.txt")), "a user's file was removed")
    rc, out, err = run(binary, ["--help"])
    check("--num_layers" in out + err or "num_layers" in out + err, "--help lacks num_layers")


def main():
    binary, mode = sys.argv[1], sys.argv[2]
    engines = ["kvengine", "rocksdb"] if "--rocksdb" in sys.argv[3:] else ["kvengine"]
    {"json": test_json, "text": test_text, "threads": test_threads,
     "bad_flags": test_bad_flags}[mode](binary, engines)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
