"""The placement check of issue 50 for the vLLM connector: a tensor-parallel-2 instance
whose scheduler and workers are separate processes, each attached to one kv_server of a
sharded cluster of three (deployment (a) of docs/vllm.md on every host).  Every block a
worker saves must land on its R rendezvous owners, not on the member the worker is
attached to: each member is asked for its own keys (a client naming that member alone,
whose requests the member answers from its own tiers), each key must be on exactly R
members, the first of them its owner (a cluster client of R = 1 asks only that one), and
a prefix saved through member 0's socket loads bit-exact through member 2's."""
import multiprocessing
import os
import socket
import subprocess
import time

import pytest
import torch

import kvengine
import vllm_fakes as fk
import vllm_process as vp
from spawned import Spawned

KV_SERVER = os.path.join(os.path.dirname(kvengine.__file__), "..", "..", "kv_server")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Member:
    """A kv_server of the cluster, serving peers on TCP and this host's processes on a
    local socket."""

    def __init__(self, root, index, peers, replicas):
        self.address = peers[index]
        self.socket = os.path.join(root, "m%d.sock" % index)
        env = dict(os.environ, KVENGINE_PEERS=",".join(peers))  # --options splits at commas
        self.proc = subprocess.Popen(
            [KV_SERVER, "--db=" + os.path.join(root, "m%d" % index),
             "--listen=" + self.address, "--transport=tcp", "--local_listen=" + self.socket,
             "--options=memory_capacity_bytes=128MiB,prefault_memory=false,"
             "ssd_capacity_bytes=0,log_level=error,peer_mode=sharded,"
             "cluster_replicas=%d" % replicas],
            stdout=subprocess.PIPE, env=env)
        line = self.proc.stdout.readline().decode()
        assert "serving" in line, line

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def Process(ctx, *args):
    return Spawned(ctx, vp.main, *args)


@pytest.mark.skipif(not os.access(KV_SERVER, os.X_OK), reason="kv_server is not built")
@pytest.mark.parametrize("replicas", [1, 2])
def test_tensor_parallel_workers_attached_to_a_member_save_to_the_owners(tmp_path, replicas):
    root = str(tmp_path)
    peers = ["127.0.0.1:%d" % free_port() for _ in range(3)]
    members = [Member(root, m, peers, replicas) for m in range(3)]
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        none_hash = fk._sha256("0")
        tokens = [(i * 13) % 32000 for i in range(4 * vp.BS + 3)]  # 4 full blocks
        hashes = fk.block_hashes(tokens, vp.BS, none_hash)
        store = os.path.join(root, "unused")  # every process attaches: no path opened

        def instance(engine_id, member):
            sock = members[member].socket
            sched = Process(ctx, "scheduler", store, 2, engine_id, None, False, sock)
            workers = [Process(ctx, "worker", store, 2, engine_id, r, False, sock)
                       for r in range(2)]
            procs.extend([sched] + workers)
            assert all(p("attached") == sock for p in [sched] + workers)
            return sched, workers

        def run(sched, workers, req_id, ids, compute):
            matched, meta = sched("schedule", req_id, tokens, ids, none_hash)
            for w in workers:
                assert w("step", meta, compute) == []
            return matched

        sched_a, workers_a = instance("A", 0)
        ids_a = [4, 1, 7, 3, 9]
        assert run(sched_a, workers_a, "ra", ids_a, list(zip(ids_a, hashes))) == 0
        saved = [w("blocks", ids_a[:4]) for w in workers_a]
        keys = [k for w in workers_a for k in w("keys", hashes)]
        assert len(keys) == len(set(keys)) and len(keys) >= 2 * 4

        # Who holds each key: each member asked alone.
        held = [0] * len(keys)
        for address in peers:
            with kvengine.DB(os.path.join(root, "ask_" + address.replace(":", "_")),
                             peers=address, peer_mode="sharded", memory_capacity_bytes="16MiB",
                             prefault_memory=False, ssd_capacity_bytes=0,
                             apply_environment=False) as one:
                for i, r in enumerate(one.batch_is_exist(keys)):
                    held[i] += r == 1
        assert [k for k, n in zip(keys, held) if n != replicas] == []
        # The first owner holds it: a cluster client of R = 1 asks only that member.
        with kvengine.DB(os.path.join(root, "ask_owner"), peers=",".join(peers),
                         peer_mode="sharded", memory_capacity_bytes="16MiB",
                         prefault_memory=False, ssd_capacity_bytes=0,
                         apply_environment=False) as first:
            missing = [k for k, r in zip(keys, first.batch_is_exist(keys)) if r != 1]
        assert missing == []

        # Another instance, attached to another member, loads the whole prefix.
        sched_b, workers_b = instance("B", 2)
        ids_b = [11, 12, 13, 14, 15]
        assert run(sched_b, workers_b, "rb", ids_b, []) == 4 * vp.BS
        loaded = [w("blocks", ids_b[:4]) for w in workers_b]
        assert all(torch.equal(x, y) for ra, rb in zip(saved, loaded)
                   for ba, bb in zip(ra, rb) for x, y in zip(ba, bb))
    finally:
        for p in reversed(procs):
            p.close()
        for m in members:
            m.stop()


@pytest.mark.skipif(not os.access(KV_SERVER, os.X_OK), reason="kv_server is not built")
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_layerwise_load_over_the_cluster_is_bit_exact_when_a_member_dies(tmp_path, replicas):
    """The worker's load (Store.batch_get_into_groups) through a cluster client: each
    layer reported in order with its bytes in, and a member SIGKILLed once layer 0 is in
    costs failed keys (R = 1) or none (R = 2), never bytes that were not its value."""
    root = str(tmp_path)
    peers = ["127.0.0.1:%d" % free_port() for _ in range(3)]
    members = [Member(root, m, peers, replicas) for m in range(3)]
    try:
        layers, blocks, size = 16, 8, 128 << 10
        keys = ["m@tp0/L%d/b%d" % (la, b) for la in range(layers) for b in range(blocks)]
        value = {k: (k.encode() * (size // len(k) + 1))[:size] for k in keys}
        with kvengine.DB(os.path.join(root, "client"), peers=",".join(peers),
                         peer_mode="sharded", cluster_replicas=replicas,
                         memory_capacity_bytes="16MiB", prefault_memory=False,
                         ssd_capacity_bytes=0, apply_environment=False) as db:
            for la in range(layers):
                part = keys[la * blocks:(la + 1) * blocks]
                assert db.batch_put_from(part, [value[k] for k in part]) == [0] * blocks
            outs = [bytearray(size) for _ in keys]
            ends = [(la + 1) * blocks for la in range(layers)]
            reported = []

            def on_ready(g, results):
                for k, out, r in zip(keys[g * blocks:], outs[g * blocks:], results):
                    assert r < 0 or (r == size and bytes(out) == value[k]), k
                reported.append(g)
                if g == 0:
                    members[1].stop()

            got = db.batch_get_into_groups(keys, [[o] for o in outs], None, ends, on_ready)
        assert reported == list(range(layers))
        failed = [k for k, r in zip(keys, got) if r < 0]
        assert all(bytes(o) == value[k] for k, o, r in zip(keys, outs, got) if r >= 0)
        if replicas == 1:
            assert failed and all(r == kvengine.IO_ERROR for r in got if r < 0)
        else:
            assert failed == []
    finally:
        for m in members:
            m.stop()
