"""A router that resyncs after a restart (issue 49; docs/observability.md, "Resync after
a restart"): a stand-in of a cache-aware router indexes a store's events -- the keys a
writer stored, the removals of the store's feed -- and, after it restarts mid-stream
(while the writer goes on) or after the store restarts (a new boot epoch), rebuilds its
index from a snapshot (DB.read_resident) and the feed's events after the snapshot's
removal_sequence.  It must end with exactly the store's resident set, key for key."""
import random
import threading

import kvengine

OPTS = dict(memory_capacity_bytes="64MiB", prefault_memory=False, apply_environment=False,
            ssd_capacity_bytes="256MiB")


class Writer(threading.Thread):
    """The only mutator of the store: puts and deletes keys at random, and publishes each
    put as a "stored" event carrying the feed's newest sequence after it (every removal
    numbered at or below it came before the put)."""

    def __init__(self, db, keys, steps, seed):
        super().__init__(daemon=True)
        self.db, self.keys, self.steps = db, keys, steps
        self.rng = random.Random(seed)
        self.events = []  # ("stored", key, feed position), in order
        self.lock = threading.Lock()

    def run(self):
        for _ in range(self.steps):
            key = self.rng.choice(self.keys)
            if self.rng.random() < 0.7:
                assert self.db.put(key, b"v" * 256) == 0
                position = self.db.read_removals(0, 0)[2]
                with self.lock:
                    self.events.append((key, position))
            else:
                self.db.remove(key)

    def stored_since(self, start):
        with self.lock:
            return self.events[start:], len(self.events)


class Router:
    """A router's index of one store: key -> tiers.  It learns of stores from the
    writer's events and of removals from the store's feed, applied in feed order."""

    def __init__(self):
        self.index = {}
        self.cursor = None  # the feed's sequence applied through
        self.epoch = None
        self.stored_seen = 0

    def resync(self, db, writer):
        """After a restart (the router's or the store's): subscribe to the writer's
        events first, then the snapshot, then everything after it."""
        self.index.clear()
        self.stored_seen = writer.stored_since(0)[1] if writer else 0  # subscribed
        batches = []
        epoch, sequence, count = db.read_resident(batches.append, b"", 64)
        entries = [e for batch in batches for e in batch]
        assert count == len(entries) and all(len(b) <= 64 for b in batches)
        for tier, key in entries:
            self.index.setdefault(key, set()).add(tier)
        self.epoch, self.cursor = epoch, sequence
        # A put whose feed position is below the snapshot's sequence finished before the
        # snapshot began: the snapshot has it, or a removal before the snapshot took it.
        self.catch_up(db, writer, skip_below=sequence)

    def catch_up(self, db, writer, skip_below=0):
        """The feed's removals first, then the stores published so far: a store
        published after the removals were read comes after them too."""
        removals = []
        while True:
            events, missed, _ = db.read_removals(self.cursor, 1024)
            assert missed == 0
            if not events:
                break
            removals += events
            self.cursor = events[-1][0]
        stored, self.stored_seen = writer.stored_since(self.stored_seen) if writer else ([], 0)
        stored = [(key, p) for key, p in stored if p >= skip_below]
        i = 0
        for seq, _, tier, _, key in removals:
            while i < len(stored) and stored[i][1] < seq:
                self._stored(stored[i][0])
                i += 1
            tiers = self.index.get(key)
            if tiers is not None:
                tiers.discard(tier)
                if not tiers:
                    del self.index[key]
        for key, _ in stored[i:]:
            self._stored(key)

    def _stored(self, key):
        # A put supersedes the key's copies in other tiers: an SSD copy of an older
        # version is dropped without a removal event ("overwrites are not removals").
        self.index[key] = {"memory"}

    def keys(self):
        return set(self.index)


def resident(db, keys):
    """The store's truth: every key it holds, asked key by key."""
    located = db.batch_locate(keys)
    return {k for k, where in zip(keys, located) if where > 0}


def make_keys(n):
    return [("model@tp0/L0/%016x" % i).encode() for i in range(n)]


def test_a_router_restarting_mid_stream_ends_with_the_resident_set(db_path):
    keys = make_keys(400)
    with kvengine.open(db_path, **OPTS) as db:
        router = Router()
        router.cursor = db.read_removals(0, 0)[2]
        router.epoch = db.epoch()
        writer = Writer(db, keys, 4000, seed=1)
        writer.start()
        while writer.is_alive() and len(writer.events) < 500:
            router.catch_up(db, writer)
        restarted = Router()  # the router restarts: its index is gone
        restarted.resync(db, writer)  # while the writer goes on
        writer.join()
        restarted.catch_up(db, writer)
        router.catch_up(db, writer)
        truth = resident(db, keys)
        assert len(truth) > 50
        assert restarted.keys() == truth
        assert router.keys() == truth  # the one that never restarted agrees
        assert restarted.epoch == db.epoch()


def test_after_the_store_restarts_the_router_sees_a_new_epoch_and_resyncs(db_path):
    keys = make_keys(300)
    router = Router()
    with kvengine.open(db_path, **OPTS) as db:
        writer = Writer(db, keys, 1500, seed=2)
        router.resync(db, None)
        writer.run()  # in this thread
        router.catch_up(db, writer)
        assert router.keys() == resident(db, keys)
        first_epoch = db.epoch()
        assert db.flush() == 0  # what the restarted store finds on SSD
    with kvengine.open(db_path, **OPTS) as db:
        assert db.epoch() != first_epoch  # the store restarted: its feed starts again
        assert router.epoch == first_epoch
        router.resync(db, None)
        truth = resident(db, keys)
        assert len(truth) > 50
        assert router.keys() == truth
        assert {tier for tiers in router.index.values() for tier in tiers} == {"ssd"}
        # and it follows the restarted store from there
        writer = Writer(db, keys, 500, seed=3)
        router.stored_seen = 0
        writer.run()
        router.catch_up(db, writer)
        assert router.keys() == resident(db, keys)


def test_the_snapshot_reports_each_tier_and_only_the_default_namespaces_keys(db_path):
    with kvengine.open(db_path, **OPTS) as db:
        assert db.put(b"a/1", b"x" * 100) == 0
        assert db.put(b"a/2", b"x" * 100) == 0
        assert db.put(b"b/1", b"x" * 100) == 0
        assert db.flush() == 0  # on SSD too
        tenant = db.create_namespace("tenant")
        assert tenant.put(b"a/3", b"x" * 100) == 0
        epoch, sequence, entries = db.snapshot(prefix=b"a/")
        assert epoch == db.epoch() and epoch > 0
        assert sorted(entries) == [("memory", b"a/1"), ("memory", b"a/2"), ("ssd", b"a/1"),
                                   ("ssd", b"a/2")]
        assert sequence == db.read_removals(0, 0)[2]
        assert db.remove(b"a/1") == 0
        _, after, entries = db.snapshot(prefix=b"a/")
        assert after == sequence + 2  # the delete left both tiers
        assert sorted(entries) == [("memory", b"a/2"), ("ssd", b"a/2")]
        stopped = []
        db.read_resident(lambda batch: stopped.append(batch) or False, b"", 1)
        assert len(stopped) == 1  # False stops the snapshot
        assert db.stats()["epoch"] == epoch
