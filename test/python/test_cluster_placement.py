"""The placement check of issue 50 for every Python door (docs/cluster.md, "Routing"):
three kv_server members of a sharded cluster -- static peers or etcd, R = 1 and 2 --
each serving its host's processes on a local socket, and writes through

* the vLLM connector: a tensor-parallel-2 instance whose scheduler and two workers are
  separate spawned processes, each attached to member 0 (deployment (a) of
  docs/vllm.md);
* the SGLang backend attached to member 1, and the LMCache plug-in attached to member 2;
* the Python store API: attached to member 1 (a batch and single puts), and a DB that is
  a client of the cluster without being a member.

Then each member is asked alone which keys it holds (a peer's request is answered from
the member's own tiers), and every key must be on exactly its R rendezvous owners
(kvengine.rendezvous_owners); and what each door wrote reads back bit-exact through
another member's socket: a second vLLM instance attached to member 2 loads the whole
prefix, an SGLang backend on member 0 prefetches the pages, the Python store reads the
rest."""
import multiprocessing
import os

import pytest
import torch

import fleet
import kvengine
import lmcache_driver as drv
import lmcache_fakes as lf
import sglang_process as sp
import vllm_fakes as fk
import vllm_process as vp
from spawned import Spawned

pytestmark = [pytest.mark.fleet,
              pytest.mark.skipif(not os.access(fleet.KV_SERVER, os.X_OK),
                                 reason="kv_server is not built")]

BLOCKS = 6  # the prompt of issue 50: 6 full blocks and a tail
SGLANG = ("mha", "page_first", "bfloat16")


def vllm_instance(ctx, engine_id, socket):
    """A TP-2 vLLM instance attached to socket: [scheduler, worker 0, worker 1], started
    at once."""
    store = os.path.join(os.path.dirname(socket), "unused")  # attached: no path opened
    return Spawned.all(ctx, (vp.main, "scheduler", store, 2, engine_id, None, False, socket),
                       *[(vp.main, "worker", store, 2, engine_id, r, False, socket)
                         for r in range(2)])


def vllm_run(instance, req_id, tokens, ids, none_hash, compute):
    sched, *workers = instance
    matched, meta = sched("schedule", req_id, tokens, ids, none_hash)
    for w in workers:
        assert w("step", meta, compute) == []  # no load errors
    return matched


@pytest.fixture(params=[("static", 1), ("static", 2), ("etcd", 1), ("etcd", 2)],
                ids=lambda p: "%s-R%d" % p)
def cluster(request, tmp_path):
    on_etcd = request.param[0] == "etcd"
    if on_etcd and not fleet.ETCD:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    network = fleet.Network(3, use_netns=False)  # placement needs no namespaces
    c = fleet.Cluster(str(tmp_path), network, request.param[1], on_etcd)
    yield c
    c.close()


def test_every_door_puts_each_key_on_its_owners(cluster, tmp_path):
    m0, m1, m2 = cluster.members
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        # The vLLM instances start first: their processes import torch meanwhile.
        procs = vllm_instance(ctx, "A", m0.socket) + vllm_instance(ctx, "B", m2.socket)
        inst_a, inst_b = procs[:3], procs[3:]
        assert all(p("attached") == m0.socket for p in inst_a)
        keys = []

        # vLLM: instance A saves a prompt of 6 blocks through member 0.
        none_hash = fk._sha256("0")
        tokens = [(i * 13) % 32000 for i in range(BLOCKS * vp.BS + 5)]
        hashes = fk.block_hashes(tokens, vp.BS, none_hash)
        ids_a = [4, 1, 7, 3, 9, 5, 6]
        assert vllm_run(inst_a, "ra", tokens, ids_a, none_hash, list(zip(ids_a, hashes))) == 0
        saved = [w("blocks", ids_a[:BLOCKS]) for w in inst_a[1:]]
        vllm_keys = [k for w in inst_a[1:] for k in w("keys", hashes)]
        assert len(set(vllm_keys)) == 2 * BLOCKS * 3  # ranks x blocks x layers
        keys += vllm_keys

        # SGLang: one rank's backend attached to member 1 backs up 5 pages.
        writer = sp.Rank({"attach": m1.socket}, 0, 1)
        prompt = [(i * 31 + 7) % 32000 for i in range(5 * sp.PAGE + 3)]
        done, digests = writer.backup(SGLANG, prompt, list(range(5)), 1)
        assert done == 5 * sp.PAGE
        keys += writer.keys(SGLANG, prompt, list(range(5)))
        writer.close()

        # LMCache: the plug-in attached to member 2 stores 8 chunks.
        adapter = lf.make_adapter_from_cli(drv.spec(attach=m2.socket))
        chunks = list(range(8))
        assert drv.store(adapter, [drv.key(i) for i in chunks],
                         [drv.memory_obj(drv.chunk_bytes(i, 16 << 10)) for i in chunks]
                         ).is_successful()
        keys += [lf._object_key_to_string(drv.key(i)) for i in chunks]
        adapter.close()

        # The Python store API: attached to member 1, and a client of the cluster.
        values = {}
        with kvengine.attach(m1.socket, apply_environment=False) as db:
            batch = ["py/attached/batch.%d" % i for i in range(24)]
            values.update((k, os.urandom(4096 + i)) for i, k in enumerate(batch))
            assert db.batch_put(batch, [values[k] for k in batch]) == [0] * len(batch)
            for i in range(8):
                k = "py/attached/one.%d" % i
                values[k] = os.urandom(3000 + i)
                assert db.put(k, values[k]) == 0
        with kvengine.DB(str(tmp_path / "client"), **cluster.client_options()) as client:
            batch = ["py/client/batch.%d" % i for i in range(24)]
            values.update((k, os.urandom(5000 + i)) for i, k in enumerate(batch))
            assert client.batch_put(batch, [values[k] for k in batch]) == [0] * len(batch)
        keys += list(values)

        assert len(keys) == len(set(keys))
        assert cluster.misplaced(keys) == []

        # Each door's writes read back bit-exact through another member.
        ids_b = [11, 12, 13, 14, 15, 0, 2]
        assert vllm_run(inst_b, "rb", tokens, ids_b, none_hash, []) == BLOCKS * vp.BS
        loaded = [w("blocks", ids_b[:BLOCKS]) for w in inst_b[1:]]
        assert all(torch.equal(x, y) for ra, rb in zip(saved, loaded)
                   for ba, bb in zip(ra, rb) for x, y in zip(ba, bb))
        reader = sp.Rank({"attach": m0.socket}, 0, 1)
        assert reader.hit(SGLANG, prompt) == 5 * sp.PAGE
        assert reader.load(SGLANG, prompt, 5 * sp.PAGE, 2) == (5 * sp.PAGE, digests)
        reader.close()
        with kvengine.attach(m0.socket, apply_environment=False) as db:
            for k, v in values.items():
                assert db.get(k) == v, k
            for i in chunks:
                k = lf._object_key_to_string(drv.key(i))
                assert db.get(k) == drv.chunk_bytes(i, 16 << 10), k
    finally:
        for p in reversed(procs):
            p.close()
