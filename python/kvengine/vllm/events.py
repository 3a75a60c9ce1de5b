"""KV cache events: what the connector tells vLLM's event publisher, so that a cache-aware
router (vLLM's, Dynamo's, llm-d's) learns which instance can load which prefix
(docs/vllm.md, "KV cache events").

The path is vLLM's own (vllm/distributed/kv_events.py and the KV connector's hooks):

* each worker (every TP/PP rank) returns a KVEngineKVEvents from
  get_kv_connector_kv_cache_events every step -- empty when it has nothing, so that it
  is counted -- holding BlockStored for the blocks it saved this step and BlockRemoved
  for the blocks kvengine evicted or deleted;
* vLLM's KVOutputAggregator concatenates the ranks' events and counts the ranks;
* the scheduler-side connector keeps them (update_connector_output) and, in
  take_events, publishes only the events every rank reported (aggregate()).

Removals come from the store's removal feed (DB::ReadRemovals): every rank reads the
same feed, up to the sequence the scheduler put in the step's metadata, so the ranks
report the same removals in the same step.  A block is removed from a tier as soon as one
of its keys (any layer, any rank) leaves that tier: the instance can no longer load it
from there.  Event hashes are what vLLM's own events carry: the low 64 bits of the block
hash as an int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, vLLM's default), else the hash's
bytes; the connector keeps a bounded map from the hash of each block it announced to what
it announced, to announce its removal.
"""

import collections
import logging
import os
import re

from ._vllm_compat import (BlockRemoved, BlockStored, KVConnectorKVEvents, KVEventAggregator)

logger = logging.getLogger("kvengine.vllm")

MEDIUM_MEMORY = "KVENGINE_MEMORY"
MEDIUM_SSD = "KVENGINE_SSD"
MEDIUM_OF_TIER = {"memory": MEDIUM_MEMORY, "ssd": MEDIUM_SSD}
LOCATED_SSD = 2  # DB::BatchLocate's kLocatedSsd


def events_enabled(vllm_config, extra) -> bool:
    """vLLM publishes KV events when kv_events_config.enable_kv_cache_events is set;
    kv_connector_extra_config["kv_events"] overrides (True / False)."""
    if "kv_events" in extra:
        return bool(extra["kv_events"])
    config = getattr(vllm_config, "kv_events_config", None)
    return bool(getattr(config, "enable_kv_cache_events", False))


def external_hash(hash_hex):
    """The hash vLLM's events carry for a block (maybe_convert_block_hash): the low 64
    bits of the hash's bytes, big-endian, as an int (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES,
    default on), else the bytes themselves."""
    if hash_hex is None:
        return None
    raw = bytes.fromhex(hash_hex if len(hash_hex) % 2 == 0 else "0" + hash_hex)
    if not bool(int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1"))):
        return raw
    return int.from_bytes(raw, byteorder="big") & ((1 << 64) - 1)


class KVEngineKVEvents(KVConnectorKVEvents):
    """One step's events of one rank, then (merged by vLLM) of all ranks: a
    KVEventAggregator underneath, as vLLM's connectors keep theirs.  No __len__ or
    __bool__: vLLM tests the object's truth to count the rank, and an empty rank must be
    counted."""

    def __init__(self, num_workers: int) -> None:
        self._aggregator = KVEventAggregator(num_workers)

    def add_events(self, events: list) -> None:
        self._aggregator.add_events(events)

    def aggregate(self) -> "KVEngineKVEvents":
        """Keeps only the events every worker reported (each once)."""
        common = self._aggregator.get_common_events()
        self._aggregator.clear_events()
        self._aggregator.add_events(common)
        self._aggregator.reset_workers()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._aggregator.increment_workers(count)

    def get_all_events(self) -> list:
        return self._aggregator.get_all_events()

    def get_number_of_workers(self) -> int:
        return self._aggregator.get_number_of_workers()

    def clear_events(self) -> None:
        self._aggregator.clear_events()
        self._aggregator.reset_workers()

    def __repr__(self) -> str:
        return "<KVEngineKVEvents events=%r>" % (self.get_all_events(),)


class RemovalFeedReader:
    """One reader's cursor on the store's removal feed, keeping the removals of this
    instance's block keys: (hash hex, tier, reason, time in microseconds, key).

    The cursor starts at the feed's newest event when the reader is made (the store starts
    recording then, if no one read it before).  A store without a feed (an owner built
    before it, removal_feed_capacity=0) makes a reader that reads nothing, said once."""

    MAX_EVENTS = 4096  # per call

    def __init__(self, db, keys):
        self._db = db
        self._pattern = re.compile(keys.block_key_pattern())
        self.missed = 0
        self.cursor = self.last_sequence()
        if self.cursor is None:
            logger.warning("kvengine: the store has no removal feed: KV events announce no "
                           "removals, and the request account tells no eviction")

    def last_sequence(self):
        """The feed's newest sequence (None when the store has no feed)."""
        got = self._db.read_removals(0, 0)
        return None if isinstance(got, int) else got[2]

    def read(self, through=None):
        """The removals after the cursor, up to sequence `through` (everything when
        None); advances the cursor."""
        out = []
        while self.cursor is not None and (through is None or self.cursor < through):
            got = self._db.read_removals(self.cursor, self.MAX_EVENTS)
            if isinstance(got, int):
                logger.warning("kvengine: reading the removal feed failed (%d)", got)
                break
            events, missed, _ = got
            if missed:
                self.missed += missed
                logger.warning("kvengine: %d removals were overwritten in the store's feed "
                               "before this process read them", missed)
            if not events:
                break
            for seq, time_us, tier, reason, key in events:
                if through is not None and seq > through:
                    return out
                self.cursor = seq
                text = key.decode("utf-8", "replace")
                m = self._pattern.match(text)
                if m:
                    out.append((m.group(1), tier, reason, time_us, text))
        if through is not None and self.cursor is not None:
            self.cursor = max(self.cursor, through)
        return out


class BlockEvents:
    """A worker's events: BlockStored for the blocks it saved, BlockRemoved (and the SSD
    tier's BlockStored, when memory lets go of a block the SSD tier holds) from the
    removal feed, for the blocks it announced.  Bounded: the oldest announced blocks are
    forgotten past max_blocks (their removals then go unannounced)."""

    def __init__(self, db, keys, max_blocks=100_000):
        self._db = db
        self._reader = RemovalFeedReader(db, keys)
        self._max_blocks = max_blocks
        # hash hex -> [event hash, parent event hash, token ids, block size, media set,
        #              (lora id, lora name) or None]
        self._announced = collections.OrderedDict()
        self._pending = []
        self._epoch = db.epoch()

    def stored(self, hash_hex, parent_hex, token_ids, block_size, lora=None):
        """A block this rank saved; lora: its request's (lora_int_id, lora_name)."""
        ext = external_hash(hash_hex)
        parent = external_hash(parent_hex)
        tokens = list(token_ids or ())
        self._pending.append(self._stored_event(ext, parent, tokens, block_size, MEDIUM_MEMORY,
                                                lora))
        entry = self._announced.get(hash_hex)
        if entry is None:
            self._announced[hash_hex] = [ext, parent, tokens, block_size, {"memory"}, lora]
        else:
            entry[4].add("memory")
            self._announced.move_to_end(hash_hex)
        while len(self._announced) > self._max_blocks:
            self._announced.popitem(last=False)

    @staticmethod
    def _stored_event(ext, parent, tokens, block_size, medium, lora=None):
        lora_id, lora_name = lora if lora is not None else (None, None)
        return BlockStored(block_hashes=[ext], parent_block_hash=parent, token_ids=tokens,
                           block_size=block_size, lora_id=lora_id, medium=medium,
                           lora_name=lora_name)

    def replayed(self, hash_hex, tiers, block_size):
        """A block the store holds in `tiers`, found by a snapshot (Resync): announced
        with what the key tells (its hash; no parent, no tokens), and tracked for its
        removals like a saved block."""
        ext = external_hash(hash_hex)
        self._announced[hash_hex] = [ext, None, [], block_size, set(tiers), None]
        return [self._stored_event(ext, None, [], block_size, MEDIUM_OF_TIER[tier])
                for tier in sorted(tiers)]

    def forget_all(self) -> list:
        """BlockRemoved for every block still announced, in each medium; forgets them."""
        events = [BlockRemoved(block_hashes=[entry[0]], medium=MEDIUM_OF_TIER[tier])
                  for entry in self._announced.values() for tier in sorted(entry[4])]
        self._announced.clear()
        return events

    def take(self, through=None) -> list:
        """This step's events: the saves recorded, then the removals read up to
        `through`."""
        epoch = self._db.epoch()
        if epoch is not None and self._epoch is not None and epoch != self._epoch:
            # The store restarted: what this rank announced is gone with its memory tier
            # (a router resyncs from the scheduler's replay), and the new store's feed
            # numbers its events from 1 again.
            self._pending += self.forget_all()
            self._reader.cursor = self._reader.last_sequence()
        if epoch is not None:
            self._epoch = epoch
        for hash_hex, tier, reason, _, key in self._reader.read(through):
            entry = self._announced.get(hash_hex)
            if entry is None or tier not in entry[4]:
                continue  # not announced by this process, or announced gone already
            entry[4].discard(tier)
            self._pending.append(BlockRemoved(block_hashes=[entry[0]],
                                              medium=MEDIUM_OF_TIER[tier]))
            if tier == "memory" and reason == "capacity" and "ssd" not in entry[4]:
                located = self._db.batch_locate([key])
                if located and located[0] == LOCATED_SSD:  # offloaded, not dropped
                    entry[4].add("ssd")
                    self._pending.append(self._stored_event(entry[0], entry[1], entry[2],
                                                            entry[3], MEDIUM_SSD, entry[5]))
            if not entry[4]:
                del self._announced[hash_hex]
        events, self._pending = self._pending, []
        return events


class Resync:
    """The scheduler side's replay of the store's resident blocks, for a router that
    (re)builds its index (docs/vllm.md, "KV cache events"; docs/observability.md,
    "Resync after a restart"): when asked (request(), e.g. after a router restarted) and
    when the store's boot epoch changes (the store restarted: its memory tier and feed are
    new), a snapshot of this instance's block keys (DB.read_resident) becomes BlockStored
    events, one per block and tier holding any of its keys -- when the store restarted,
    BlockRemoved for every block an earlier replay announced first, and the replay one
    step later.  The replayed blocks' removals are then announced from the feed, from
    the snapshot's removal_sequence on.  An attached scheduler's snapshot is its owner's
    (READ_RESIDENT); a store that cannot list its keys (an owner older than that) replays
    nothing, said once."""

    def __init__(self, db, keys):
        self._db = db
        self._keys = keys
        self._pattern = re.compile(keys.block_key_pattern())
        self._epoch = db.epoch()
        self._requested = False
        self._tracked = None  # BlockEvents of the last replay
        self._warned = False

    def request(self):
        """Replay at the next step."""
        self._requested = True

    def take(self) -> list:
        epoch = self._db.epoch()
        restarted = epoch is not None and self._epoch is not None and epoch != self._epoch
        if epoch is not None:
            self._epoch = epoch
        if restarted:
            # Replay at the next call: by then every worker has seen the new epoch and
            # its BlockRemoved for what it announced has been published before the
            # replay's BlockStored.
            self._requested = True
            out = self._tracked.forget_all() if self._tracked is not None else []
            self._tracked = None
            return out
        if not self._requested:
            return self._tracked.take() if self._tracked is not None else []
        self._requested = False
        out = self._tracked.take() if self._tracked is not None else []
        tracked = BlockEvents(self._db, self._keys)
        blocks = collections.defaultdict(set)

        def collect(batch):
            for tier, key in batch:
                m = self._pattern.match(key.decode("utf-8", "replace"))
                if m:
                    blocks[m.group(1)].add(tier)

        got = self._db.read_resident(collect, (self._keys.key_model + "@").encode(), 4096)
        if isinstance(got, int):
            if not self._warned:
                logger.warning("kvengine: the store cannot list its blocks (%d): no replay "
                               "for routers (an attached store's owner older than READ_RESIDENT)",
                               got)
                self._warned = True
            self._tracked = None
            return out
        tracked._reader.cursor = got[1]  # removals after the snapshot only
        for hash_hex, tiers in blocks.items():
            out += tracked.replayed(hash_hex, tiers, self._keys.block_size)
        self._tracked = tracked
        return out
