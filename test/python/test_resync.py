"""A router that resyncs after a restart (issue 49; docs/observability.md, "Resync after
a restart"): a stand-in of a cache-aware router indexes a store's events -- the keys a
writer stored, the removals of the store's feed -- and, after it restarts mid-stream
(while the writer goes on) or after the store restarts (a new boot epoch), rebuilds its
index from a snapshot (DB.read_resident) and the feed's events after the snapshot's
removal_sequence.  It must end with exactly the store's resident set, key for key.

The same through the vLLM connector in deployment (a) of docs/vllm.md (every process
attached to a kv_server): the router indexes the published KV events, and the scheduler's
replay (request_resync, or the store's new epoch) is read through the attach protocol's
READ_RESIDENT."""
import os
import random
import signal
import subprocess
import threading

import pytest

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
        self.held = []  # stores whose feed position is past the cursor: (key, position)

    def resync(self, db, writer):
        """After a restart (the router's or the store's): subscribe to the writer's
        events first, then the snapshot, then everything after it."""
        self.index.clear()
        self.held = []
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
        """The feed's removals read so far, and the stores published so far, in feed
        order.  A store whose position is past the last removal read waits for the next
        catch-up: a removal of its key may have come just before it, after the feed was
        read, and must be applied first (else it would delete the key put after it)."""
        removals = []
        while True:
            events, missed, _ = db.read_removals(self.cursor, 1024)
            assert missed == 0
            if not events:
                break
            removals += events
            self.cursor = events[-1][0]
        stored, self.stored_seen = writer.stored_since(self.stored_seen) if writer else ([], 0)
        stored = self.held + [(key, p) for key, p in stored if p >= skip_below]
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
        ready = i
        while ready < len(stored) and stored[ready][1] <= self.cursor:
            ready += 1
        for key, _ in stored[i:ready]:
            self._stored(key)
        self.held = stored[ready:]

    def _stored(self, key):
        # A put adds the memory tier; an older SSD copy it drops comes as the feed's
        # removal from the SSD tier (applied before it: its sequence is below the put's
        # position), so the index follows each tier from events alone.
        self.index.setdefault(key, set()).add("memory")

    def keys(self):
        return set(self.index)


def resident(db, keys):
    """The store's truth: every key it holds, asked key by key."""
    located = db.batch_locate(keys)
    return {k for k, where in zip(keys, located) if where > 0}


def resident_tiers(db):
    """The store's truth per tier, at rest: key -> the tiers holding it."""
    out = {}
    for tier, key in db.snapshot()[2]:
        out.setdefault(key, set()).add(tier)
    return out


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
        assert restarted.index == router.index == resident_tiers(db)  # tier for tier
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
        writer.run()  # overwrites of keys on SSD among its puts
        router.catch_up(db, writer)
        assert router.keys() == resident(db, keys)
        assert router.index == resident_tiers(db)  # no SSD entry an overwrite dropped


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


# ---------------------------------------------------------------- the connector, attached

KV_SERVER = os.path.join(os.path.dirname(kvengine.__file__), "..", "..", "kv_server")
needs_kv_server = pytest.mark.skipif(not os.access(KV_SERVER, os.X_OK),
                                     reason="kv_server is not built")


class KvServer:
    """The host's kv_server (deployment (a)): owns the store, serves it on a socket."""

    def __init__(self, root):
        self.db = os.path.join(root, "store")
        self.socket = os.path.join(root, "kv.sock")
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen(
            [KV_SERVER, "--db=" + self.db, "--local_listen=" + self.socket,
             "--options=memory_capacity_bytes=256MiB,prefault_memory=false,"
             "ssd_capacity_bytes=1GiB,log_level=error"],
            stdout=subprocess.PIPE)
        line = self.proc.stdout.readline().decode()
        assert "serving" in line, line

    def stop(self):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            assert self.proc.wait(timeout=30) == 0
            self.proc = None


class EventRouter:
    """A router's index of one instance from its published KV events: block hash ->
    media, BlockStored adding a medium, BlockRemoved taking one away."""

    def __init__(self):
        self.index = {}

    def apply(self, batch):
        for e in (batch or {}).get("events", []):
            h = e["block_hashes"][0] if e.get("block_hashes") else None
            if e["type"] == "BlockStored":
                self.index.setdefault(h, set()).add(e["medium"])
            elif e["type"] == "BlockRemoved" and h in self.index:
                self.index[h].discard(e["medium"])
                if not self.index[h]:
                    del self.index[h]

    def blocks(self):
        return set(self.index)


def attached_instance(monkeypatch, path, socket, tp):
    """test_vllm_events' Instance, every process of it attached to `socket`."""
    pytest.importorskip("torch", reason="torch is not installed")
    pytest.importorskip("msgpack", reason="msgpack is not installed")
    import test_vllm_events as tv
    import vllm_fakes as fk

    make_config = fk.make_config
    monkeypatch.setattr(fk, "make_config", lambda *a, **kw: make_config(*a, attach=socket, **kw))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    inst = tv.Instance(path, tp=tp)
    assert inst.db.attached == socket  # the scheduler is an attached client
    return inst, tv


def ids(step):
    """The two cache blocks a step's request takes (the fake caches have 16)."""
    return [(2 * step) % 14 + 1, (2 * step) % 14 + 2]


def block_keys(inst, h, tp):
    return [inst.key(h, layer=la, rank=r) for la in range(len(inst.caches[0])) for r in range(tp)]


def resident_blocks(inst, hashes, tp, tv):
    """The store's truth, key for key: the blocks of `hashes` whose keys it holds (all of
    a block's keys, or none: the test saves and deletes blocks whole)."""
    out = set()
    for h in hashes:
        keys = block_keys(inst, h, tp)
        located = inst.db.batch_locate(keys)
        held = [where > 0 for where in located]
        assert all(held) or not any(held), "a block partly resident"
        if all(held):
            out.add(tv.ext(h))
    return out


@needs_kv_server
@pytest.mark.parametrize("tp", [1, 2])
def test_an_attached_connector_replays_for_a_router_restarting_mid_stream(
        tmp_path, monkeypatch, tp):
    server = KvServer(str(tmp_path))
    inst = None
    try:
        inst, tv = attached_instance(monkeypatch, str(tmp_path / "unused"), server.socket, tp)
        import vllm_fakes as fk
        rng = random.Random(5)
        router, restarted = EventRouter(), None
        saved = []
        for step in range(24):
            req = fk.Request("r%d" % step, tv.tokens(2 * tv.BS + 1, seed=step), tv.BS,
                             inst.none_hash)
            batch = inst.step(new=[(req, ids(step))])
            saved += list(req.block_hashes)
            if step % 3 == 2:  # a block deleted whole between steps
                victim = rng.choice(saved)
                inst.db.batch_remove(block_keys(inst, victim, tp))
            router.apply(batch)
            if restarted is not None:
                restarted.apply(batch)
            if step == 11:  # the router restarts: its index is gone; it asks for a replay
                restarted = EventRouter()
                inst.sched.request_resync()
        for _ in range(2):  # the last deletes' removals
            batch = inst.step()
            router.apply(batch)
            restarted.apply(batch)
        truth = resident_blocks(inst, saved, tp, tv)
        assert len(truth) > 10
        assert restarted.blocks() == truth
        assert router.blocks() == truth  # the router that never restarted agrees
    finally:
        if inst is not None:
            inst.close()
        server.stop()


@needs_kv_server
@pytest.mark.parametrize("tp", [1, 2])
def test_an_attached_connector_replays_after_the_kv_server_restarts(tmp_path, monkeypatch, tp):
    server = KvServer(str(tmp_path))
    inst = None
    try:
        inst, tv = attached_instance(monkeypatch, str(tmp_path / "unused"), server.socket, tp)
        import vllm_fakes as fk
        router = EventRouter()
        saved = []

        def run_requests(steps):  # one new request a step; its blocks saved
            for step in steps:
                req = fk.Request("r%d" % step, tv.tokens(2 * tv.BS + 1, seed=step), tv.BS,
                                 inst.none_hash)
                router.apply(inst.step(new=[(req, ids(step))]))
                saved.extend(req.block_hashes)

        run_requests(range(8))
        inst.db.batch_remove(block_keys(inst, saved[3], tp))
        router.apply(inst.step())
        assert router.blocks() == resident_blocks(inst, saved, tp, tv)
        first_epoch = inst.db.epoch()
        assert inst.db.flush() == 0  # what the restarted kv_server finds on SSD
        server.stop()
        server.start()  # a new boot epoch; its memory tier is empty
        for _ in range(3):  # BlockRemoved for what was announced, then the replay
            router.apply(inst.step())
        assert inst.db.epoch() != first_epoch
        truth = resident_blocks(inst, saved, tp, tv)
        assert len(truth) == len(saved) - 1
        assert router.blocks() == truth
        assert all(media == {tv.MEDIUM_SSD} for media in router.index.values())
        # and it follows the restarted store from there
        run_requests(range(8, 12))
        inst.db.batch_remove(block_keys(inst, saved[0], tp))
        router.apply(inst.step())
        assert router.blocks() == resident_blocks(inst, saved, tp, tv)
    finally:
        if inst is not None:
            inst.close()
        server.stop()
