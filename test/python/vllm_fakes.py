"""Stand-ins of the vLLM objects a KV connector sees, member for member as in vLLM main.

KVTransferConfig (vllm/config/kv_transfer.py), SchedulerOutput / NewRequestData /
CachedRequestData (vllm/v1/core/sched/output.py), KVCacheConfig and its groups
(vllm/v1/kv_cache_interface.py) carry vLLM's fields and defaults.  Request carries the
chained block hashes as vLLM computes them: sha256 over the pickled (parent hash, block
tokens, extra keys), the chain seeded with NONE_HASH, which init_none_hash draws at random
per engine process unless PYTHONHASHSEED is set.  handle_load_errors applies
kv_load_failure_policy as vLLM's scheduler does.  The KV caches take the layouts of
vLLM's attention backends (make_caches).
"""
import dataclasses
import hashlib
import os
import pickle
import uuid
from typing import Any, Optional

import torch

from kvengine.vllm import _vllm_compat as compat


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = "KVEngineConnector"
    engine_id: Optional[str] = None
    kv_buffer_device: str = "cuda"
    kv_buffer_size: float = 1e9
    kv_role: Optional[str] = "kv_both"
    kv_rank: Optional[int] = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = dataclasses.field(default_factory=dict)
    kv_connector_module_path: Optional[str] = "kvengine.vllm.connector"
    enable_permute_local_kv: bool = False
    kv_load_failure_policy: str = "fail"  # vLLM's default: "recompute" or "fail"

    def __post_init__(self):
        if self.engine_id is None:
            self.engine_id = str(uuid.uuid4())
        if self.kv_role is not None and self.kv_role not in ("kv_producer", "kv_consumer",
                                                             "kv_both"):
            raise ValueError("Unsupported kv_role: %s" % self.kv_role)
        if self.kv_connector is not None and self.kv_role is None:
            raise ValueError("Please specify kv_role when kv_connector is set")

    @property
    def is_kv_transfer_instance(self):
        return self.kv_connector is not None and self.kv_role is not None

    @property
    def is_kv_producer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_kv_consumer(self):
        return self.kv_connector is not None and self.kv_role in ("kv_consumer", "kv_both")

    def get_from_extra_config(self, key, default):
        return self.kv_connector_extra_config.get(key, default)


@dataclasses.dataclass
class ModelConfig:
    model: str = "meta-llama/Llama-3-8B"
    dtype: Any = torch.float16


@dataclasses.dataclass
class CacheConfig:
    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"


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


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: Any = None


@dataclasses.dataclass
class KVCacheTensor:
    size: int
    shared_by: list


@dataclasses.dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def make_config(path, model="meta-llama/Llama-3-8B", block_size=16, dtype=torch.float16,
                policy="fail", **extra):
    extra = dict(extra, path=path)
    extra.setdefault("options", dict(memory_capacity_bytes="64MiB", prefault_memory=False))
    return VllmConfig(ModelConfig(model=model, dtype=dtype), CacheConfig(block_size=block_size),
                      ParallelConfig(), KVTransferConfig(kv_connector_extra_config=extra,
                                                         kv_load_failure_policy=policy))


# ------------------------------------------------------------------ block hashes


def _sha256(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def init_none_hash(environ=None):
    """NONE_HASH of one engine process: from PYTHONHASHSEED, else 32 random bytes."""
    seed = (os.environ if environ is None else environ).get("PYTHONHASHSEED")
    return os.urandom(32) if seed is None else _sha256(seed)


def block_hashes(token_ids, block_size, none_hash):
    hashes, parent = [], none_hash
    for i in range(len(token_ids) // block_size):
        chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
        parent = _sha256((parent, chunk, None))
        hashes.append(parent)
    return hashes


class Request:
    def __init__(self, request_id, prompt_token_ids, block_size, none_hash):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.mm_features = []
        self.sampling_params = None
        self.pooling_params = None
        self.lora_request = None
        self.prompt_embeds = None
        self.status = "WAITING"
        self._block_size = block_size
        self._none_hash = none_hash
        self.block_hashes = []
        self.num_publishable_block_hashes = 0
        self.update_block_hashes()

    def update_block_hashes(self):
        self.block_hashes = block_hashes(self.all_token_ids, self._block_size, self._none_hash)
        self.num_publishable_block_hashes = len(self.block_hashes)

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def handle_load_errors(policy, request, block_ids, failed, block_size):
    """vLLM's scheduler after a step whose connector reported failed block ids: under
    "fail" the request finishes with an error; under "recompute" its computed tokens are
    cut back to the first failed block, which is computed again.  Returns the status."""
    hit = [i for i, b in enumerate(block_ids) if b in failed]
    if not hit:
        return request.status
    if policy == "fail":
        request.status = "FINISHED_ERROR"
    else:
        request.num_computed_tokens = min(request.num_computed_tokens, hit[0] * block_size)
        request.status = "RUNNING"
    return request.status


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = list(block_ids)

    def get_block_ids(self):
        return (list(self._ids),)


# ------------------------------------------------------------------ scheduler output


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: Optional[list]
    mm_features: list
    sampling_params: Any
    pooling_params: Any
    block_ids: tuple
    num_computed_tokens: int
    lora_request: Any
    prompt_embeds: Any = None
    prefill_token_ids: Optional[list] = None


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list
    resumed_req_ids: set
    new_token_ids: list
    all_token_ids: dict
    new_block_ids: list
    num_computed_tokens: list
    num_output_tokens: list

    @property
    def num_reqs(self):
        return len(self.req_ids)

    def is_context_phase(self, req_id):
        n = dict(zip(self.req_ids, self.num_output_tokens)).get(req_id)
        return n is not None and n == 0

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
    pending_structured_output_tokens: bool = False
    kv_connector_metadata: Any = None
    ec_connector_metadata: Any = None

    @classmethod
    def make_empty(cls):
        return cls([], CachedRequestData.make_empty(), {}, 0, {}, {}, [], set(), [])


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


# ------------------------------------------------------------------ Prometheus


class FakeMetric:
    """prometheus_client's Counter / Gauge / Histogram, enough for a connector's metrics."""
    registry = {}

    def __init__(self, name, documentation, labelnames=(), buckets=None, **_):
        self.name, self.labelnames, self.children = name, list(labelnames), {}
        FakeMetric.registry[name] = self

    def labels(self, *values):
        return self.children.setdefault(values, FakeChild())


class FakeChild:
    def __init__(self):
        self.total, self.observations = 0, []

    def inc(self, value=1):
        self.total += value

    def observe(self, value):
        self.observations.append(value)

    def set(self, value):
        self.total = value


METRIC_TYPES = {compat.Gauge: FakeMetric, compat.Counter: FakeMetric,
                compat.Histogram: FakeMetric} if not compat.HAVE_VLLM else None


# ------------------------------------------------------------------ KV caches

LAYOUTS = ["flash_nhd", "flash_hnd", "flash_legacy", "blocks_first", "mla"]


def make_caches(layout, num_layers=3, num_blocks=16, block_size=16, heads=4, head_size=8,
                dtype=torch.float16):
    """Per-layer caches as vLLM's backends allocate them: flash_nhd / flash_hnd are today's
    FlashAttention (logical (blocks, heads, block_size, 2*head_size), physical order from
    get_kv_cache_stride_order: NHD (0, 2, 1, 3), HND (0, 1, 2, 3)); flash_legacy and
    blocks_first its two earlier shapes; mla the 3-D MLA cache."""
    def one():
        if layout == "flash_nhd":
            physical = torch.zeros(num_blocks, block_size, heads, 2 * head_size, dtype=dtype)
            return physical.permute(0, 2, 1, 3)
        if layout == "flash_hnd":
            return torch.zeros(num_blocks, heads, block_size, 2 * head_size, dtype=dtype)
        if layout == "flash_legacy":
            return torch.zeros(2, num_blocks, block_size, heads, head_size, dtype=dtype)
        if layout == "blocks_first":
            return torch.zeros(num_blocks, 2, block_size, heads, head_size, dtype=dtype)
        if layout == "mla":
            return torch.zeros(num_blocks, block_size, head_size, dtype=dtype)
        raise ValueError(layout)
    return {"model.layers.%d.self_attn.attn" % i: one() for i in range(num_layers)}


def block_view(cache, layout, block_id):
    """Everything one block holds in one layer (K and V)."""
    if layout == "flash_legacy":
        return cache[:, block_id]
    return cache[block_id]


def fill_block(caches, layout, block_id, block_hash):
    """'Computes' a block: deterministic contents from its hash, different per layer."""
    for i, cache in enumerate(caches.values()):
        g = torch.Generator().manual_seed(int.from_bytes(block_hash[:6], "little") + i)
        view = block_view(cache, layout, block_id)
        view.copy_(torch.randn(view.shape, generator=g).to(cache.dtype))


def run_worker_step(worker, meta, caches, layout, compute=()):
    """One forward pass on the worker as vLLM runs it: start_load_kv, then per layer
    wait_for_layer_load, attention (here: 'computing' blocks) and save_kv_layer, then
    wait_for_save; the metadata crosses a process boundary (pickled)."""
    meta = pickle.loads(pickle.dumps(meta))
    worker.bind_connector_metadata(meta)
    worker.start_load_kv(Forward())
    for name, cache in caches.items():
        worker.wait_for_layer_load(name)
        if name == next(iter(caches)):
            for block_id, block_hash in compute:
                fill_block(caches, layout, block_id, block_hash)
        worker.save_kv_layer(name, cache, None)
    worker.wait_for_save()
    worker.clear_connector_metadata()
    return meta
