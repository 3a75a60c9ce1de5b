"""The per-request account (docs/observability.md, "The request account"): one JSON line
per request -- what it asked for, what hit in which tier, what was loaded and how fast,
what was saved, and for each block that missed, why.

Off by default.  kv_connector_extra_config:
    "request_account": "/var/log/kvengine/requests.jsonl"   # the file (appended to)
    "request_account_sample": 0.1                            # the share of requests

A request is sampled by its id (the same answer in every process).  The scheduler side
writes the lookup's part into the step's metadata (where each hit block lies, why each
other block missed); the worker of rank (tp 0, pp 0) adds the loads and saves it made
and writes the line when vLLM reports the request finished.  `kv_ldb explain
--log=FILE` summarises a file.

Why a block missed, as the engine tells it:
    absent      no key of the block is in the store, and the store announced no removal
                of one since this process started reading its feed
    evicted     a key of the block left the store: "at" (microseconds since the epoch),
                "tier" (memory, ssd) and "by" (capacity: evicted for room; deleted)
    unreadable  a key is there but could not be read: "error" (corruption, io_error...)
    after_miss  present, but after a missed block: vLLM loads a prefix only
    slower_than_recompute
                present, but the load planner (planner.py) left it to vLLM to compute:
                loading it would have taken longer; "estimate" holds what decided it
                (ms to load the cut blocks, ms to compute them, the request's estimated
                time to first token with the plan and loading every hit, the tiers)
"""

import collections
import hashlib
import json
import logging
import threading
import time

import kvengine

from .events import RemovalFeedReader

logger = logging.getLogger("kvengine.vllm")

TIER_NAMES = {1: "memory", 2: "ssd", 3: "peer"}
NOT_FOUND = -1


def sampled(req_id, rate):
    """Whether the request is in the sample: by a hash of its id, so every process agrees."""
    if rate >= 1:
        return True
    if rate <= 0:
        return False
    digest = hashlib.sha256(str(req_id).encode()).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64) < rate


class RecentRemovals:
    """This instance's keys the store removed recently (from its removal feed): key ->
    (time in microseconds, tier, reason), the newest `capacity` kept."""

    def __init__(self, db, keys, capacity=200_000):
        self._reader = RemovalFeedReader(db, keys)
        self._capacity = capacity
        self._removed = collections.OrderedDict()

    def refresh(self):
        for _, tier, reason, time_us, key in self._reader.read():
            self._removed[key] = (time_us, tier, reason)
            self._removed.move_to_end(key)
        while len(self._removed) > self._capacity:
            self._removed.popitem(last=False)

    def why(self, key):
        return self._removed.get(key)


def miss_reason(results, keys, removals):
    """Why a block whose keys answered `results` (BatchLocate) is not all there."""
    for r in results:
        if r < 0:
            return {"reason": "unreadable", "error": kvengine.error_name(r)}
    for key, r in zip(keys, results):
        if r == 0:
            seen = removals.why(key) if removals is not None else None
            if seen is not None:
                return {"reason": "evicted", "at": seen[0], "tier": seen[1], "by": seen[2]}
    return {"reason": "absent"}


class LookupAccount:
    """The scheduler side's part: the lookup of a sampled request."""

    def __init__(self, rate, db, keys):
        self.rate = rate
        self._removals = RecentRemovals(db, keys)

    def wants(self, req_id):
        return sampled(req_id, self.rate)

    def lookup(self, req_id, hashes, start, block_size, keys_per_block, located, hit,
               tokens_asked, tokens_hit, found=None, plan=None):
        """The account's first part: blocks [start, start + len(hashes)) were looked up;
        located[b] are the BatchLocate results of block b's keys (keys_per_block[b]).
        The first `found` blocks were present and the first `hit` of them are loaded (the
        load planner's `plan` cut the rest)."""
        found = hit if found is None else found
        self._removals.refresh()
        by_tier = collections.Counter()
        missed = []
        for b, (h, results) in enumerate(zip(hashes, located)):
            if b < hit:
                tier = max(results)  # the slowest tier any of its keys is in
                by_tier[TIER_NAMES.get(tier, str(tier))] += block_size
                continue
            entry = {"block": start + b, "hash": h[:16]}
            if b < found:
                entry["reason"] = "slower_than_recompute"
                if plan is not None:
                    entry["estimate"] = plan.estimate
            elif b > found and all(r > 0 for r in results):
                entry["reason"] = "after_miss"
            else:
                entry.update(miss_reason(results, keys_per_block[b], self._removals))
            missed.append(entry)
        return {"request_id": str(req_id), "tokens_asked": tokens_asked,
                "tokens_hit": tokens_hit, "tokens_hit_by_tier": dict(by_tier),
                "blocks_looked_up": len(hashes), "missed": missed}


class RequestAccounts:
    """The worker side's part: each sampled request's loads and saves, written as one
    line when the request finishes (or at shutdown).  Bounded: past `max_open` requests
    the oldest are written as they are."""

    def __init__(self, path, writer, max_open=10_000):
        self._path = path
        self._writer = writer  # this rank writes the lines
        self._max_open = max_open
        self._open = collections.OrderedDict()  # req_id -> account dict
        self._lock = threading.Lock()

    def begin(self, account):
        with self._lock:
            account.setdefault("blocks_loaded", 0)
            account.setdefault("bytes_loaded", 0)
            account.setdefault("blocks_saved", 0)
            account.setdefault("save_ms", 0.0)
            self._open[account["request_id"]] = account
            while len(self._open) > self._max_open:
                self._write(self._open.popitem(last=False)[1])

    def get(self, req_id):
        return self._open.get(str(req_id))

    def loaded(self, req_id, blocks, nbytes, layer_ms, failures):
        """A load job's part for one request: its blocks loaded and bytes, each layer's
        time to ready (ms from start_load_kv), and the blocks that failed to load
        [(position, hash hex, result code, reason dict)]."""
        with self._lock:
            acc = self._open.get(str(req_id))
            if acc is None:
                return
            acc["blocks_loaded"] += blocks
            acc["bytes_loaded"] += nbytes
            if layer_ms:
                acc["load_ms"] = {"first_layer": round(layer_ms[0], 3),
                                  "last_layer": round(layer_ms[-1], 3),
                                  "per_layer": [round(x, 3) for x in layer_ms]}
            for position, h, _, reason in failures:
                entry = {"block": position, "hash": h[:16], "stage": "load"}
                entry.update(reason)
                acc["missed"].append(entry)

    def saved(self, req_id, blocks, seconds):
        with self._lock:
            acc = self._open.get(str(req_id))
            if acc is not None:
                acc["blocks_saved"] += blocks
                acc["save_ms"] = round(acc["save_ms"] + seconds * 1000.0, 3)

    def finish(self, req_ids):
        with self._lock:
            for req_id in req_ids:
                acc = self._open.pop(str(req_id), None)
                if acc is not None:
                    self._write(acc)

    def close(self):
        with self._lock:
            while self._open:
                self._write(self._open.popitem(last=False)[1])

    def _write(self, acc):
        if not self._writer:
            return
        acc["time"] = round(time.time(), 3)
        try:
            with open(self._path, "a") as f:
                f.write(json.dumps(acc, sort_keys=True) + "\n")
        except OSError as e:
            logger.warning("kvengine: cannot write the request account to %s: %s",
                           self._path, e)
