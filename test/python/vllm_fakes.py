"""Stand-ins of the vLLM objects a KV connector sees, shaped like vLLM's own.

VllmConfig / KVTransferConfig / ModelConfig / CacheConfig / ParallelConfig carry the fields
the connector reads; Request carries request_id, prompt_token_ids, num_tokens and the
chained block hashes (sha256 of the parent hash and the block's tokens, as vLLM's
default prefix-caching hash); SchedulerOutput, NewRequestData and CachedRequestData mirror
vllm/v1/core/sched/output.py; KVCacheBlocks has get_block_ids().  FakeEngine drives a
scheduler-side and a worker-side connector through steps as vLLM's engine core does,
pickling the metadata between them.
"""
import dataclasses
import hashlib
import pickle
from typing import Any, Optional

import torch


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: str = "KVEngineConnector"
    kv_connector_module_path: str = "kvengine.vllm.connector"
    kv_role: str = "kv_both"
    kv_connector_extra_config: dict = dataclasses.field(default_factory=dict)

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)

    @property
    def is_kv_producer(self):
        return self.kv_role in ("kv_producer", "kv_both")


@dataclasses.dataclass
class ModelConfig:
    model: str = "meta-llama/Llama-3-8B"
    dtype: Any = torch.float16


@dataclasses.dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"


@dataclasses.dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclasses.dataclass
class VllmConfig:
    model_config: ModelConfig
    cache_config: CacheConfig
    parallel_config: ParallelConfig
    kv_transfer_config: Optional[KVTransferConfig]


def make_config(path, model="meta-llama/Llama-3-8B", block_size=16, **extra):
    extra = dict(extra, path=path)
    extra.setdefault("options", dict(memory_capacity_bytes="64MiB", prefault_memory=False))
    return VllmConfig(ModelConfig(model=model), CacheConfig(block_size=block_size),
                      ParallelConfig(), KVTransferConfig(kv_connector_extra_config=extra))


def block_hashes(token_ids, block_size):
    hashes, parent = [], b"\0" * 32
    for i in range(len(token_ids) // block_size):
        chunk = token_ids[i * block_size:(i + 1) * block_size]
        parent = hashlib.sha256(parent + repr(tuple(chunk)).encode()).digest()
        hashes.append(parent)
    return hashes


class Request:
    def __init__(self, request_id, prompt_token_ids, block_size):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.mm_features = []
        self.block_hashes = block_hashes(self.prompt_token_ids, block_size)

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @classmethod
    def make_empty(cls):
        return cls([], set(), [], {}, [], [], [])


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    preempted_req_ids: Optional[set] = None
    kv_connector_metadata: Any = None


def new_step(new=(), cached=None, finished=(), preempted=None):
    """new: [(request, block_ids, num_computed_tokens, num_scheduled_tokens)]."""
    new_reqs, sched = [], {}
    for req, ids, computed, scheduled in new:
        new_reqs.append(NewRequestData(req.request_id, req.prompt_token_ids, [], None, None,
                                       (list(ids),), computed, None))
        sched[req.request_id] = scheduled
    cached = cached or CachedRequestData.make_empty()
    return SchedulerOutput(new_reqs, cached, sched, sum(sched.values()), {}, {}, [0],
                           set(finished), [], preempted)


def cached_step(req_ids, new_block_ids, num_computed, num_scheduled, resumed=()):
    c = CachedRequestData(list(req_ids), set(resumed), [], {}, list(new_block_ids),
                          list(num_computed), [0] * len(req_ids))
    out = new_step(cached=c)
    out.num_scheduled_tokens = dict(zip(req_ids, num_scheduled))
    out.total_num_scheduled_tokens = sum(num_scheduled)
    return out


class Forward:
    """The forward context vLLM passes to start_load_kv (unused by the connector)."""
    no_compile_layers: dict = {}
    attn_metadata: Any = None


def make_caches(layout, num_layers=3, num_blocks=16, block_size=16, heads=4, head_size=8,
                dtype=torch.float16):
    if layout == "flash":
        shape = (2, num_blocks, block_size, heads, head_size)
    elif layout == "blocks_first":
        shape = (num_blocks, 2, block_size, heads, head_size)
    elif layout == "mla":
        shape = (num_blocks, block_size, head_size)
    else:
        raise ValueError(layout)
    return {"model.layers.%d.self_attn.attn" % i: torch.zeros(shape, dtype=dtype)
            for i in range(num_layers)}


def block_view(cache, layout, block_id):
    """Everything one block holds in one layer (K and V)."""
    if layout == "flash":
        return cache[:, block_id]
    return cache[block_id]


def fill_block(caches, layout, block_id, block_hash):
    """'Computes' a block: deterministic contents from its hash, different per layer."""
    for i, cache in enumerate(caches.values()):
        g = torch.Generator().manual_seed(int.from_bytes(block_hash[:6], "little") + i)
        view = block_view(cache, layout, block_id)
        view.copy_(torch.randn(view.shape, generator=g).to(cache.dtype))


def run_worker_step(worker, meta, caches, layout, compute=()):
    """One forward pass on the worker: load, 'compute' blocks, save (metadata pickled)."""
    meta = pickle.loads(pickle.dumps(meta))
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(Forward())
    for name in caches:
        worker.wait_for_layer_load(name)
    for block_id, block_hash in compute:
        fill_block(caches, layout, block_id, block_hash)
    for name, cache in caches.items():
        worker.save_kv_layer(name, cache, None)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    return meta
