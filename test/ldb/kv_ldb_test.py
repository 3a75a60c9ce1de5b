#!/usr/bin/env python3
"""Tests of kv_ldb, run by CTest.

  kv_ldb_test.py KV_LDB LDB_MAKE_DB {offline|corrupt|errors|lock|online}

Each mode writes a small DB with ldb_make_db (40 keys, 8 per bucket, write_through; 3
overwritten, 8 deleted), then:
offline: every offline command's output (counts, keys, values, tombstones, checksums).
corrupt: damaged copies (a flipped value byte, a torn footer, a truncated bucket, foreign
         and empty bucket files, a garbage or torn tombstone log): verify fails listing
         each problem, the other commands report and never crash.
errors:  bad flags, commands, arguments, missing or foreign directories: a message and a
         non-zero exit.
lock:    while another process holds the DB open, locking commands report Busy and
         --read_only ones work.
online:  stats (text and JSON), compact (bytes reclaimed), delete.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

failures = []
KV_LDB = MAKE_DB = None


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, binary_out=False, timeout=60):
    p = subprocess.run([KV_LDB] + args, capture_output=True, text=not binary_out, errors="replace" if not binary_out else None,
                       timeout=timeout)
    # A negative return code is a signal: kv_ldb must never crash.
    check(p.returncode >= 0, f"kv_ldb {args} died of signal {-p.returncode}: {p.stderr}")
    return p.returncode, p.stdout, p.stderr


def value(seed, size):
    return bytes(((seed * 31 + j * 7) & 0xFF) for j in range(size))


def make_db(root):
    path = os.path.join(root, "db")
    p = subprocess.run([MAKE_DB, "create", path], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit(f"ldb_make_db failed: {p.stderr}")
    live, deleted, superseded = {}, [], []
    for line in p.stdout.splitlines():
        f = line.split()
        if f[0] == "live":
            live[f[1]] = (int(f[2]), int(f[3]))
        elif f[0] == "deleted":
            deleted.append(f[1])
        elif f[0] == "superseded":
            superseded.append(f[1])
    return path, live, deleted, superseded


def bucket_files(db):
    return sorted(f for f in os.listdir(db) if re.fullmatch(r"bucket-\d{6}\.kvb", f))


# ---------------------------------------------------------------- offline

def test_offline(root):
    db, live, deleted, superseded = make_db(root)
    buckets = bucket_files(db)
    check(len(buckets) >= 5, f"expected >= 5 buckets, got {buckets}")

    rc, out, err = run(["list_buckets", f"--db={db}"])
    check(rc == 0, f"list_buckets rc {rc}: {err}")
    rows = [l.split() for l in out.splitlines()[1:-1]]
    check(len(rows) == len(buckets), f"list_buckets rows {len(rows)} != {len(buckets)}")
    check(all(r[-1] == "ok" for r in rows), f"list_buckets states: {out}")
    check(sum(int(r[4]) for r in rows) == len(live), f"live keys != {len(live)}: {out}")
    check(all(int(r[3]) <= 8 for r in rows), "a bucket holds more than bucket_keys_limit keys")
    check(f"{len(live)} live keys" in out.splitlines()[-1], f"summary line: {out}")

    rc, out, err = run(["list_buckets", f"--db={db}", "--json"])
    check(rc == 0, f"list_buckets --json rc {rc}: {err}")
    j = json.loads(out)
    check(j["live_keys"] == len(live), f"json live_keys {j['live_keys']}")
    check(j["corrupt"] == 0, "json corrupt != 0")
    # Deleted bytes: the 8 deleted values and the 3 superseded first versions.
    dead = sum(1000 + 997 * int(k[-3:]) for k in deleted + superseded)
    check(j["deleted_bytes"] == dead, f"deleted_bytes {j['deleted_bytes']} != {dead}")
    check(j["live_bytes"] == sum(s for s, _ in live.values()), "live_bytes")
    for b in j["buckets"]:
        exp = b["deleted_bytes"] / (b["live_bytes"] + b["deleted_bytes"])
        check(abs(b["deleted_ratio"] - exp) < 1e-6, f"deleted_ratio of bucket {b['id']}")

    rc, out, err = run(["scan", f"--db={db}"])
    check(rc == 0, f"scan rc {rc}: {err}")
    lines = out.splitlines()
    check(lines[-1] == f"{len(live)} keys", f"scan count line: {lines[-1]}")
    line_re = re.compile(r"^'([^']+)' tier:ssd bucket:(\d+) size:(\d+) version:(\d+)$")
    seen = {}
    for l in lines[:-1]:
        m = line_re.match(l)
        check(m is not None, f"scan line format: {l!r}")
        if m:
            seen[m.group(1)] = int(m.group(3))
    check(seen == {k: s for k, (s, _) in live.items()}, "scan keys and sizes")
    check(list(seen) == sorted(seen), "scan is not in key order")
    rc, out, _ = run(["scan", f"--db={db}", "--prefix=model@tp0/layer.1/"])
    n1 = len([k for k in live if k.startswith("model@tp0/layer.1/")])
    check(out.splitlines()[-1] == f"{n1} keys", f"scan --prefix: {out}")
    rc, out, _ = run(["scan", f"--db={db}", r"--regex=.*chunk\.0[0-1][0-9]"])
    nre = len([k for k in live if re.fullmatch(r".*chunk\.0[0-1][0-9]", k)])
    check(out.splitlines()[-1] == f"{nre} keys", f"scan --regex: {out}")
    rc, out, _ = run(["scan", f"--db={db}", "--limit=5"])
    check(out.splitlines()[-1] == "5 keys" and len(out.splitlines()) == 6, f"scan --limit: {out}")
    rc, out, _ = run(["scan", f"--db={db}", "--json", "--prefix=model@tp0/layer.2/"])
    j = json.loads(out)
    check(j["count"] == len([k for k in live if k.startswith("model@tp0/layer.2/")]),
          "scan --json count")
    check(all(k["tier"] == "ssd" and k["size"] == live[k["key"]][0] for k in j["keys"]),
          "scan --json keys")

    # get: raw bytes, hex, file, info; the overwritten key returns its newest value.
    for key in (superseded[0], sorted(live)[-1]):
        size, seed = live[key]
        rc, out, err = run(["get", f"--db={db}", key, "--raw"], binary_out=True)
        check(rc == 0 and out == value(seed, size), f"get --raw {key}: rc {rc} {err}")
    key = sorted(live)[5]
    size, seed = live[key]
    rc, out, err = run(["get", f"--db={db}", f"--key={key}"])
    check(rc == 0 and f"size:{size}" in out and " OK" in out, f"get info: {out} {err}")
    check(f"value: {value(seed, 32).hex()}..." in out, f"get preview: {out}")
    rc, out, err = run(["get", f"--db={db}", key, "--hex"])
    hexed = "".join("".join(l[10:58].split()) for l in out.splitlines()[1:])
    check(rc == 0 and hexed == value(seed, size).hex(), f"get --hex: {err}")
    outfile = os.path.join(root, "value.bin")
    rc, out, err = run(["get", f"--db={db}", key, f"--out={outfile}"])
    check(rc == 0 and open(outfile, "rb").read() == value(seed, size), f"get --out: {err}")
    rc, out, err = run(["get", f"--db={db}", deleted[0]])
    check(rc == 1 and "not found" in err, f"get of a deleted key: rc {rc} {err}")

    rc, out, err = run(["tombstones", f"--db={db}"])
    check(rc == 0, f"tombstones rc {rc}: {err}")
    for k in deleted + superseded:
        check(f"'{k}' version:" in out, f"tombstones lacks {k}")
    rc, out, err = run(["tombstones", f"--db={db}", "--json"])
    j = json.loads(out)
    check(j["count"] >= len(deleted) + len(superseded), f"tombstones count {j['count']}")
    check(all(t["covers"] and t["bucket_exists"] for t in j["tombstones"]),
          "every tombstone should still cover a value")
    check(j["torn_bytes"] == 0, "torn bytes")

    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=1", "--values"])
    check(rc == 0, f"dump_bucket rc {rc}: {err}")
    check("header: bucket_id:1 " in out and "footer: index_offset:" in out, f"dump header: {out}")
    entry_re = re.compile(r"^'[^']+' version:\d+ offset:\d+ size:\d+ checksum:0x[0-9a-f]{16} "
                          r"(live|tombstoned|superseded|duplicate) => [0-9a-f.]+ checksum:OK$")
    entries = [l for l in out.splitlines() if l.startswith("'")]
    check(len(entries) == 8 and all(entry_re.match(l) for l in entries), f"dump entries: {out}")
    # An overwritten version is tombstoned by the engine; a deleted one too.
    for k in superseded + [d for d in deleted if d in out]:
        check(re.search(f"'{re.escape(k)}' version:\\d+ .* tombstoned =>", out), f"dump state of {k}")
    check(len([l for l in entries if " live => " in l]) ==
          len([k for k in live if f"'{k}' version:" in out and k not in superseded]),
          "dump live states")
    rc, out2, err = run(["dump_bucket", f"--file={os.path.join(db, buckets[0])}"])
    check(rc == 0 and "index: 8 entries" in out2, f"dump_bucket --file: {err}")

    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 0 and out.splitlines()[-1].endswith(": OK"), f"verify: rc {rc} {out} {err}")
    rc, out, err = run(["verify", f"--db={db}", "--json"])
    j = json.loads(out)
    check(rc == 0 and j["ok"] and j["values"] == 43 and j["buckets"] == len(buckets),
          f"verify --json: {out}")
    # Nothing offline modified the DB (the LOCK file aside).
    check(bucket_files(db) == buckets, "the bucket files changed")


# ---------------------------------------------------------------- corrupt

def flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def test_corrupt(root):
    db, live, deleted, superseded = make_db(root)
    buckets = bucket_files(db)
    # 1: a byte of the first live value of bucket 1.
    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=1"])
    m = re.search(r"^'([^']+)' version:\d+ offset:(\d+) size:\d+ checksum:\S+ live$", out, re.M)
    check(m is not None, f"bucket 1 has a live value: {out}")
    first_key, value_offset = m.group(1), int(m.group(2))
    flip(os.path.join(db, buckets[0]), value_offset + 10)
    # 2: the footer of bucket 2; 3: bucket 3 truncated; foreign and empty files.
    size2 = os.path.getsize(os.path.join(db, buckets[1]))
    flip(os.path.join(db, buckets[1]), size2 - 20)
    os.truncate(os.path.join(db, buckets[2]), 5000)
    with open(os.path.join(db, "bucket-000077.kvb"), "wb") as f:
        f.write(os.urandom(3 * 4096))
    open(os.path.join(db, "bucket-000078.kvb"), "wb").close()

    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 1, f"verify on a corrupt DB: rc {rc}")
    check(f"'{first_key}'" in err and "MISMATCH" in err, f"verify lists the bad value: {err}")
    for name in (buckets[1], buckets[2], "bucket-000077.kvb", "bucket-000078.kvb"):
        check(name in err, f"verify lists {name}: {err}")
    rc, out, err = run(["verify", f"--db={db}", "--json"])
    check(rc == 1 and not json.loads(out)["ok"] and len(json.loads(out)["problems"]) == 5,
          f"verify --json on a corrupt DB: {out}")

    rc, out, err = run(["list_buckets", f"--db={db}"])
    check(rc == 0, f"list_buckets on a corrupt DB: rc {rc} {err}")
    states = {l.split()[1]: l for l in out.splitlines()[1:-1]}
    check(states[buckets[0]].split()[-1] == "ok", "bucket 1 structure is sound")
    for name in (buckets[1], buckets[2], "bucket-000077.kvb", "bucket-000078.kvb"):
        check("corrupt: Corruption" in states.get(name, ""), f"list_buckets state of {name}")
    check("footer" in states[buckets[1]], f"the footer is named: {states[buckets[1]]}")

    rc, out, err = run(["get", f"--db={db}", first_key, "--raw"])
    check(rc == 1 and "MISMATCH" in err and out == "", f"get of a corrupt value: {err}")
    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=1", "--values"])
    check(rc == 1 and "checksum:MISMATCH" in out, f"dump_bucket --values: {out}")
    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=2"])
    check(rc == 1 and "footer: CORRUPT" in out and "header: bucket_id:2" in out,
          f"dump_bucket of a torn footer: {out}")
    for f in (buckets[2], "bucket-000077.kvb", "bucket-000078.kvb"):
        rc, out, err = run(["dump_bucket", f"--file={os.path.join(db, f)}", "--values"])
        check(rc == 1 and "CORRUPT" in out, f"dump_bucket --file={f}: rc {rc} {out}")
    for path in ("/", "/dev/null", os.path.join(db, "IDENTITY")):
        rc, out, err = run(["dump_bucket", f"--file={path}"])
        check(rc == 1, f"dump_bucket --file={path}: rc {rc}")
    for cmd in (["scan"], ["tombstones"], ["get", sorted(live)[-1]]):
        rc, out, err = run(cmd + [f"--db={db}"])
        check(rc in (0, 1), f"{cmd} on a corrupt DB: rc {rc}")

    # Random damage anywhere in a sound bucket (seeded): reported, never a crash.
    import random
    rng = random.Random(5)
    sound = os.path.join(db, buckets[3])
    data = open(sound, "rb").read()
    fuzz = os.path.join(root, "fuzz.kvb")
    for _ in range(25):
        d = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            d[rng.randrange(len(d))] ^= 1 << rng.randrange(8)
        if rng.random() < 0.3:
            d = d[:rng.randrange(len(d))]
        open(fuzz, "wb").write(bytes(d))
        rc, out, err = run(["dump_bucket", f"--file={fuzz}", "--values"])
        check(rc in (0, 1), f"dump_bucket of a damaged file: rc {rc} {err}")

    # The tombstone log: a torn tail is a warning; garbage is corruption.
    db2 = os.path.join(root, "db2")
    shutil.copytree(db, db2)
    for f in os.listdir(db2):
        if f.startswith("bucket-") and f not in (buckets[0],):
            os.remove(os.path.join(db2, f))
    shutil.copy(os.path.join(db, buckets[3]), db2)  # a sound bucket
    flip(os.path.join(db2, buckets[0]), value_offset + 10)  # undo the value flip
    with open(os.path.join(db2, "TOMBSTONES"), "ab") as f:
        f.write(b"\x07torn!!")
    rc, out, err = run(["tombstones", f"--db={db2}"])
    check(rc == 0 and "torn tail: 7 bytes" in out, f"torn tail: {out} {err}")
    rc, out, err = run(["verify", f"--db={db2}"])
    check(rc == 0 and "torn tail of 7 bytes" in out, f"verify with a torn tail: rc {rc} {out} {err}")
    # One flipped bit in the first record, valid records after it: damage, not a torn
    # tail (verify passed it with a warning, and recovery lost every delete after it).
    log = open(os.path.join(db2, "TOMBSTONES"), "rb").read()
    rc, out, err = run(["tombstones", f"--db={db2}", "--json"])
    records = json.loads(out)["count"]
    check(records >= 3, f"several tombstones to damage: {out}")
    flip(os.path.join(db2, "TOMBSTONES"), 24 + 6)  # past the header (format 2: 24 bytes)
    rc, out, err = run(["tombstones", f"--db={db2}", "--json"])
    t = json.loads(out)
    check(rc == 0 and t["count"] == records - 1 and t["damaged_bytes"] > 0 and
          t["torn_bytes"] == 7, f"tombstones past a damaged record: {out}")
    rc, out, err = run(["verify", f"--db={db2}"])
    check(rc == 1 and "TOMBSTONES: DAMAGED" in err, f"verify of a damaged record: rc {rc} {out} {err}")
    with open(os.path.join(db2, "TOMBSTONES"), "wb") as f:
        f.write(os.urandom(100))
    rc, out, err = run(["tombstones", f"--db={db2}"])
    check(rc == 1 and "tombstone log" in err, f"garbage tombstone log: {err}")
    rc, out, err = run(["verify", f"--db={db2}"])
    check(rc == 1 and "TOMBSTONES" in err, f"verify of a garbage log: {err}")
    rc, out, err = run(["list_buckets", f"--db={db2}"])
    check(rc == 0 and "unreadable" in out, f"list_buckets with a garbage log: {out}")
    # An emptied log lost every delete its guard says it held: a problem, named.
    open(os.path.join(db2, "TOMBSTONES"), "wb").close()
    rc, out, err = run(["verify", f"--db={db2}"])
    check(rc == 1 and "LOST DELETES" in err, f"verify with an emptied log: rc {rc} {out} {err}")
    # A DB from before guards: a format-1 log (16-byte header, no records), no guard.
    os.remove(os.path.join(db2, "TOMBSTONES.guard"))
    with open(os.path.join(db2, "TOMBSTONES"), "wb") as f:
        f.write(b"KVVTOMB1" + (1).to_bytes(4, "little") + bytes(4))
    rc, out, err = run(["verify", f"--db={db2}"])
    check(rc == 0, f"verify with a format-1 log and no guard: {err}")


# ---------------------------------------------------------------- errors

def test_errors(root):
    db, live, _, _ = make_db(root)
    empty = os.path.join(root, "empty")
    os.mkdir(empty)
    missing = os.path.join(root, "missing")
    commands = {
        "list_buckets": [], "dump_bucket": ["--bucket=1"], "scan": [], "get": ["k"],
        "tombstones": [], "verify": [], "stats": [], "compact": [], "delete": ["k"],
    }
    for cmd, extra in commands.items():
        rc, out, err = run([cmd] + extra)
        check(rc == 2 and "--db" in err, f"{cmd} without --db: rc {rc} {err}")
        rc, out, err = run([cmd, f"--db={missing}"] + extra)
        check(rc != 0 and "does not exist" in err, f"{cmd} on a missing dir: rc {rc} {err}")
        rc, out, err = run([cmd, f"--db={empty}"] + extra)
        check(rc != 0 and "not a kvengine DB" in err, f"{cmd} on a foreign dir: rc {rc} {err}")
        rc, out, err = run([cmd, f"--db={db}", "--no_such_flag=1"] + extra)
        check(rc != 0 and "no_such_flag" in err, f"{cmd} with an unknown flag: rc {rc} {err}")
        rc, out, err = run([cmd, f"--db={db}", "--limit=notanumber"] + extra)
        check(rc != 0 and "limit" in err, f"{cmd} with a malformed flag: rc {rc} {err}")
        rc, out, err = run([cmd, f"--db={db}", "x", "y"] + extra)
        check(rc == 2 and "unexpected argument" in err, f"{cmd} with extra args: rc {rc} {err}")
        rc, out, err = run(["help", cmd])
        check(rc == 0 and out.startswith(cmd), f"help {cmd}: {out}")
    check(os.listdir(empty) == [] and not os.path.exists(missing), "kv_ldb created files")
    rc, out, err = run(["list_buckets", f"--db={db}", "--key=x"])
    check(rc == 2 and "does not apply" in err, f"a flag of another command: {err}")
    for cmd in ("stats", "compact", "delete"):
        rc, out, err = run([cmd, f"--db={db}", "--read_only", "--key=k"])
        check(rc == 2 and "read_only" in err, f"{cmd} --read_only: {err}")
    rc, out, err = run(["stats", f"--db={db}", "--options=no_such_option=1"])
    check(rc == 2 and "no_such_option" in err, f"stats with a bad option: {err}")
    rc, out, err = run(["stats", f"--db={db}", "--options=memory_capacity_bytes"])
    check(rc == 2 and "name=value" in err, f"stats with a malformed option: {err}")
    rc, out, err = run(["scan", f"--db={db}", "--regex=(unclosed"])
    check(rc == 2 and "regex" in err, f"scan with a bad regex: {err}")
    rc, out, err = run(["get", f"--db={db}"])
    check(rc == 2 and "key is required" in err, f"get without a key: {err}")
    rc, out, err = run(["get", f"--db={db}", "--key=a", "b"])
    check(rc == 2, f"get with two keys: {err}")
    rc, out, err = run(["get", f"--db={db}", "a", "--raw", "--hex"])
    check(rc == 2 and "exclude" in err, f"get --raw --hex: {err}")
    rc, out, err = run(["dump_bucket", f"--db={db}"])
    check(rc == 2 and "--bucket" in err, f"dump_bucket without a bucket: {err}")
    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=1", "--file=/x"])
    check(rc == 2, f"dump_bucket with --bucket and --file: {err}")
    rc, out, err = run(["dump_bucket", f"--db={db}", "--bucket=999"])
    check(rc == 1 and "no bucket 999" in err, f"dump_bucket of a missing bucket: {err}")
    rc, out, err = run(["dump_bucket", "--file=/no/such/file"])
    check(rc == 1 and "no such file" in err, f"dump_bucket of a missing file: {err}")
    rc, out, err = run(["no_such_command", f"--db={db}"])
    check(rc == 2 and "unknown command" in err, f"unknown command: {err}")
    rc, out, err = run([])
    check(rc == 2 and "no command" in err, f"no command: {err}")
    rc, out, err = run(["help"])
    check(rc == 0 and all(c in out for c in commands), f"help: {out}")
    rc, out, err = run(["help", "nope"])
    check(rc == 2, "help of an unknown command")
    rc, out, err = run(["--help"])
    for flag in ("-db", "-read_only", "-preview_bytes", "-regex", "-options", "-json"):
        check(flag in out + err, f"--help lacks {flag}")


# ---------------------------------------------------------------- lock

def test_lock(root):
    db, live, _, _ = make_db(root)
    holder = subprocess.Popen([MAKE_DB, "hold", db], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        check(holder.stdout.readline().strip() == "ready", "the holder did not open the DB")
        for cmd in (["list_buckets"], ["verify"], ["scan"], ["stats"], ["compact"]):
            rc, out, err = run(cmd + [f"--db={db}"])
            check(rc == 1 and "in use by another process" in err and "Busy" in err,
                  f"{cmd} while the DB is open elsewhere: rc {rc} {err}")
        rc, out, err = run(["list_buckets", f"--db={db}", "--read_only"])
        check(rc == 0 and f"{len(live)} live keys" in out, f"list_buckets --read_only: {err}")
        rc, out, err = run(["verify", f"--db={db}", "--read_only"])
        check(rc == 0, f"verify --read_only: {err}")
        key = sorted(live)[3]
        rc, out, err = run(["get", f"--db={db}", key, "--read_only", "--raw"], binary_out=True)
        check(rc == 0 and out == value(live[key][1], live[key][0]), "get --read_only")
    finally:
        holder.stdin.close()
        check(holder.wait(timeout=60) == 0, "the holder failed")
    rc, out, err = run(["list_buckets", f"--db={db}"])
    check(rc == 0, f"list_buckets after the holder left: {err}")


# ---------------------------------------------------------------- online

def test_online(root):
    db, live, deleted, superseded = make_db(root)
    rc, out, err = run(["stats", f"--db={db}"])
    check(rc == 0 and out.strip() != "", f"stats: rc {rc} {err}")
    rc, out, err = run(["stats", f"--db={db}", "--json", "--options=log_level=error"])
    check(rc == 0, f"stats --json: rc {rc} {err}")
    try:
        json.loads(out)
    except json.JSONDecodeError as e:
        check(False, f"stats --json is not JSON ({e}): {out}")
    # peers: the kvengine.peers property; a DB without peers says so and exits 1.
    rc, out, err = run(["peers", f"--db={db}", "--options=log_level=off"])
    check(rc == 1 and "no peers" in err, f"peers without peers: rc {rc} {out} {err}")
    rc, out, err = run(["peers", f"--db={db}", "--options=peers=127.0.0.1:9,log_level=off"])
    check(rc == 0 and "member: 127.0.0.1:9" in out and "membership: static" in out,
          f"peers: rc {rc} {out} {err}")

    rc, out, err = run(["list_buckets", f"--db={db}", "--json"])
    before = json.loads(out)
    check(before["deleted_bytes"] > 0, "deleted bytes before compact")
    # Holes punched over the dead values only (no bucket rewritten): they read as zeros,
    # which verify and dump_bucket must call reclaimed, not corrupt.
    rc, out, err = run(["compact", f"--db={db}",
                        "--options=gc_deleted_ratio=1,gc_merge_deleted_ratio=1"])
    m = re.match(r"compact: reclaimed (\d+) bytes", out)
    check(rc == 0 and m and int(m.group(1)) > 0, f"compact (holes): rc {rc} {out} {err}")
    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 0, f"verify after punching holes: rc {rc} {out} {err}")
    punched = [b["id"] for b in before["buckets"] if b.get("deleted_bytes", 0) > 0]
    rc, out, err = run(["dump_bucket", f"--db={db}", f"--bucket={punched[0]}", "--values"])
    check(rc == 0 and "reclaimed (hole punched)" in out and "MISMATCH" not in out,
          f"dump_bucket after punching holes: rc {rc} {out} {err}")
    rc, out, err = run(["compact", f"--db={db}",
                        "--options=gc_deleted_ratio=0,gc_merge_deleted_ratio=0,"
                        "gc_max_buckets_per_round=100"])
    m = re.match(r"compact: reclaimed (\d+) bytes", out)
    check(rc == 0 and m and int(m.group(1)) > 0, f"compact: rc {rc} {out} {err}")
    rc, out, err = run(["list_buckets", f"--db={db}", "--json"])
    after = json.loads(out)
    check(after["deleted_bytes"] == 0, f"deleted bytes after compact: {after['deleted_bytes']}")
    check(after["live_keys"] == len(live), "compact lost keys")
    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 0, f"verify after compact: {err}")
    for key, (size, seed) in list(live.items())[:5]:
        rc, out, err = run(["get", f"--db={db}", key, "--raw"], binary_out=True)
        check(rc == 0 and out == value(seed, size), f"get after compact: {key}")

    key = sorted(live)[0]
    rc, out, err = run(["delete", f"--db={db}", key])
    check(rc == 0 and "deleted" in out, f"delete: rc {rc} {err}")
    rc, out, err = run(["delete", f"--db={db}", f"--key={key}"])
    check(rc == 1 and "not found" in err, f"delete of an absent key: rc {rc} {err}")
    rc, out, err = run(["get", f"--db={db}", key])
    check(rc == 1 and "not found" in err, "get after delete")
    rc, out, err = run(["scan", f"--db={db}"])
    check(out.splitlines()[-1] == f"{len(live) - 1} keys", f"scan after delete: {out}")
    rc, out, err = run(["tombstones", f"--db={db}"])
    check(f"'{key}' version:" in out, "the delete's tombstone")

    # A corrupt bucket: DB::Open (stats) quarantines it; the offline commands then list it
    # as quarantined, and verify warns about it without failing (it left the DB).
    victim = bucket_files(db)[-1]
    victim_id = int(victim[7:13])
    size = os.path.getsize(os.path.join(db, victim))
    flip(os.path.join(db, victim), size - 20)
    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 1 and victim in err, f"verify before the quarantine: {err}")
    rc, out, err = run(["stats", f"--db={db}", "--options=log_level=off"])
    check(rc == 0 and "ssd.quarantined_buckets: 1" in out, f"stats quarantines: {out} {err}")
    check(os.path.exists(os.path.join(db, "quarantine", victim)), "the bucket was quarantined")
    rc, out, err = run(["list_buckets", f"--db={db}"])
    check(rc == 0 and re.search(victim + r".* quarantined,corrupt: ", out), f"quarantined: {out}")
    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 0 and f"warning: quarantine/{victim}" in out, f"verify with a quarantined bucket: {out}")
    rc, out, err = run(["dump_bucket", f"--db={db}", f"--bucket={victim_id}"])
    check(rc == 1 and "quarantine/" in out and "footer: CORRUPT" in out, f"dump of it: {out}")

    # A copy of a bucket under another spelling of its id is no bucket of the DB: kv_ldb
    # does not count it (it read it as a second bucket 1), recovery moves it aside (it
    # failed the whole open).
    first = bucket_files(db)[0]
    stray = "bucket-%d.kvb" % int(first[7:13])
    shutil.copy(os.path.join(db, first), os.path.join(db, stray))
    rc, out, err = run(["list_buckets", f"--db={db}", "--json"])
    check(rc == 0 and stray not in out and len(json.loads(out)["buckets"]) == len(after["buckets"]),
          f"list_buckets ignores {stray}: {out}")
    rc, out, err = run(["verify", f"--db={db}"])
    check(rc == 0 and f"warning: {stray}: not the name of a bucket" in out, f"verify warns: {out}")
    rc, out, err = run(["stats", f"--db={db}", "--options=log_level=off"])
    check(rc == 0 and "ssd.quarantined_buckets: 1" in out, f"stats quarantines {stray}: {out} {err}")
    check(os.path.exists(os.path.join(db, "quarantine", stray)), f"{stray} was quarantined")

    # A damaged tombstone log fails the open with a message naming it (stats crashed).
    flip(os.path.join(db, "TOMBSTONES"), 2)
    rc, out, err = run(["stats", f"--db={db}", "--options=log_level=off"])
    check(rc == 1 and "TOMBSTONES" in err, f"stats with a damaged log header: rc {rc} {err}")


# ---------------------------------------------------------------- descriptors

def test_descriptors(root):
    """300 bucket files, kv_ldb allowed 48 descriptors: it opens files on demand."""
    import resource
    db = os.path.join(root, "db")
    p = subprocess.run([MAKE_DB, "many", db], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        sys.exit(f"ldb_make_db many failed: {p.stderr}")
    check(len(bucket_files(db)) == 300, f"{len(bucket_files(db))} bucket files, not 300")

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    for args in (["verify", f"--db={db}"], ["scan", f"--db={db}"]):
        p = subprocess.run([KV_LDB] + args, capture_output=True, text=True, timeout=120,
                           preexec_fn=low_limit)
        check(p.returncode == 0, f"kv_ldb {args[0]} under 48 descriptors: rc {p.returncode}: "
                                 f"{p.stderr[-300:]}")
        if args[0] == "scan":
            check(p.stdout.splitlines()[-1:] == ["300 keys"], f"scan: {p.stdout[-200:]}")
    key = "model@tp0/layer.1/chunk.297"
    p = subprocess.run([KV_LDB, "get", f"--db={db}", key, "--raw"], capture_output=True, timeout=60,
                       preexec_fn=low_limit)
    check(p.returncode == 0 and p.stdout == value(297, 397),
          f"get under 48 descriptors: rc {p.returncode} {p.stderr[-200:]}")


# ---------------------------------------------------------------- namespaces

def test_namespaces(root):
    db = os.path.join(root, "db")
    p = subprocess.run([MAKE_DB, "namespaces", db], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        sys.exit(f"ldb_make_db failed: {p.stderr}")
    spaces = {}
    for line in p.stdout.splitlines():
        _, name, key, size, seed = line.split()
        spaces.setdefault(name, {})[key] = (int(size), int(seed))

    rc, out, err = run(["namespaces", f"--db={db}", "--json"])
    check(rc == 0, f"namespaces --json: rc {rc} {err}")
    listed = json.loads(out)
    names = [n["name"] for n in listed["namespaces"]]
    check(names == ["tenant-a", "tenant-b"], f"namespaces lists {names}")
    a = listed["namespaces"][0]
    check(a["memory_quota_bytes"] == 1 << 20 and a["weight"] == 2 and not a["dropping"],
          f"tenant-a's options: {a}")
    check([n["ssd_keys"] for n in listed["namespaces"]] == [5, 3], f"ssd keys: {listed}")
    check(listed["default_ssd_keys"] == 5 and listed["orphan_ssd_keys"] == 0, f"{listed}")
    rc, out, _ = run(["namespaces", f"--db={db}"])
    check(rc == 0 and "tenant-a" in out and "dropping" not in out, f"namespaces text: {out}")

    # scan and get within each namespace: its keys, as its user sees them, its values.
    for name, keys in spaces.items():
        rc, out, err = run(["scan", f"--db={db}", f"--namespace={name}", "--json"])
        check(rc == 0, f"scan --namespace={name}: rc {rc} {err}")
        got = sorted(k["key"] for k in json.loads(out)["keys"])
        check(got == sorted(keys), f"scan --namespace={name}: {got}")
        for key, (size, seed) in keys.items():
            rc, out, err = run(["get", f"--db={db}", f"--namespace={name}", key, "--raw"],
                               binary_out=True)
            check(rc == 0 and out == value(seed, size), f"get --namespace={name} {key}: rc {rc}")
    rc, out, _ = run(["scan", f"--db={db}", "--namespace=tenant-a", "--regex=ns\\.[34]", "--json"])
    check(sorted(k["key"] for k in json.loads(out)["keys"]) == ["ns.3", "ns.4"],
          f"scan --regex in a namespace: {out}")
    rc, out, _ = run(["scan", f"--db={db}", "--json"])
    check(json.loads(out)["count"] == 13, f"scan of every stored key: {out}")
    rc, _, err = run(["get", f"--db={db}", "--namespace=tenant-b", "ns.4"])
    check(rc == 1 and "not found" in err, f"get of a key tenant-b lacks: rc {rc} {err}")
    rc, _, err = run(["scan", f"--db={db}", "--namespace=nobody"])
    check(rc == 2 and "no namespace 'nobody'" in err, f"scan of an unknown namespace: {rc} {err}")

    # A damaged registry is an error, never a guess.
    flip(os.path.join(db, "NAMESPACES"), 20)
    rc, _, err = run(["namespaces", f"--db={db}"])
    check(rc == 1 and "damaged" in err, f"namespaces over a damaged registry: rc {rc} {err}")
    rc, _, err = run(["scan", f"--db={db}", "--namespace=tenant-a"])
    check(rc == 1 and "damaged" in err, f"scan over a damaged registry: rc {rc} {err}")


def main():
    global KV_LDB, MAKE_DB
    if len(sys.argv) != 4:
        sys.exit("usage: kv_ldb_test.py KV_LDB LDB_MAKE_DB MODE")
    KV_LDB, MAKE_DB, mode = sys.argv[1:]
    tests = {"offline": test_offline, "corrupt": test_corrupt, "errors": test_errors,
             "lock": test_lock, "online": test_online,
             "descriptors": test_descriptors, "namespaces": test_namespaces}
    if mode not in tests:
        sys.exit(f"unknown mode {mode}")
    root = tempfile.mkdtemp(prefix=f"kv_ldb_{mode}_")
    try:
        tests[mode](root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if failures:
        print(f"{len(failures)} failures")
        sys.exit(1)
    print("OK")


if __name__ == "__main__":
    main()
