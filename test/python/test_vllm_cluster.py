"""A layer-wise load through a sharded cluster of three kv_servers (issue 50 item 7):
each layer reported in order as its bytes are in, bit-exact, also when a member dies
mid-load.  (The placement checks of every door are in test_cluster_placement.py.)"""
import os
import subprocess

import pytest

import kvengine
from fleet import free_port

KV_SERVER = os.path.join(os.path.dirname(kvengine.__file__), "..", "..", "kv_server")




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


@pytest.mark.skipif(not os.access(KV_SERVER, os.X_OK), reason="kv_server is not built")
@pytest.mark.parametrize("replicas", [1, 2])
@pytest.mark.parametrize("door", ["client", "attached"])
def test_a_layerwise_load_over_the_cluster_is_bit_exact_when_a_member_dies(tmp_path, replicas,
                                                                           door):
    """The worker's load (Store.batch_get_into_groups) through a cluster client, and
    through a process attached to member 0 (a TP worker: its owner runs the pipelined
    load for it, docs/attach.md "Layer-wise loads"): each layer reported in order with
    its bytes in, and a member SIGKILLed once layer 0 is in costs failed keys (R = 1) or
    none (R = 2), never bytes that were not its value."""
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
            reader = db if door == "client" else kvengine.attach(members[0].socket)

            def on_ready(g, results):
                for k, out, r in zip(keys[g * blocks:], outs[g * blocks:], results):
                    assert r < 0 or (r == size and bytes(out) == value[k]), k
                reported.append(g)
                if g == 0:
                    members[1].stop()

            got = reader.batch_get_into_groups(keys, [[o] for o in outs], None, ends, on_ready)
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
