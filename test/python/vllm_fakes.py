"""Stand-ins of the vLLM objects a KV connector sees, member for member as in vLLM main.

KVTransferConfig (vllm/config/kv_transfer.py), SchedulerOutput / NewRequestData /
CachedRequestData (vllm/v1/core/sched/output.py), KVCacheConfig and its groups
(vllm/v1/kv_cache_interface.py) carry vLLM's fields and defaults.  Request carries the
chained block hashes as vLLM computes them: sha256 over the pickled (parent hash, block
tokens, extra keys), the chain seeded with NONE_HASH, which init_none_hash draws at random
per engine process unless PYTHONHASHSEED is set.  handle_load_errors applies
kv_load_failure_policy as vLLM's scheduler does.  The KV caches take the layouts of
vLLM's attention backends (make_caches).  Checked by scripts/check_vllm_conformance.py
(FAKE_CLASSES in test/python/vllm_conformance.py); last against vLLM main as recorded in
docs/vllm.md, "Conformance with vLLM main" (2026-12-07:
vllm-project/vllm@00f4240ee6458263d76cf51ca7901ce1350bb4d1's base.py, multi_connector.py,
outputs.py and kv_connector_model_runner_mixin.py, which run_worker_step and
worker_output follow).
"""
import collections
import copy
import dataclasses
import hashlib
import importlib
import os
import pickle
import types
import uuid
from typing import Any, Optional

import torch

from kvengine.vllm import _vllm_compat as compat


def kv_buffer_device_default_factory() -> str:
    # vLLM: current_platform.device_type.
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclasses.dataclass
class KVTransferConfig:
    kv_connector: Optional[str] = None
    engine_id: Optional[str] = None
    kv_buffer_device: str = dataclasses.field(default_factory=kv_buffer_device_default_factory)
    kv_buffer_size: float = 1e9
    kv_role: Optional[str] = None
    kv_rank: Optional[int] = None
    kv_parallel_size: int = 1
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    kv_connector_extra_config: dict = dataclasses.field(default_factory=dict)
    kv_connector_module_path: Optional[str] = None
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
    model: str = "Qwen/Qwen3-0.6B"
    dtype: Any = torch.float16
    # vLLM: loaded from the model's config.json (get_config) in __post_init__, with
    # hf_overrides applied; make_config sets them from HF_CONFIG.
    hf_config: Any = dataclasses.field(init=False)
    hf_text_config: Any = dataclasses.field(init=False)
    revision: Optional[str] = None
    quantization: Optional[str] = None
    hf_overrides: Any = dataclasses.field(default_factory=dict)


# The transformers config of a Llama-3-8B-shaped model: the fields vLLM's ModelConfig
# reads from hf_text_config (what make_config gives ModelConfig.hf_config).
HF_CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=32,
                 num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=4096,
                 rope_theta=500000.0, max_position_embeddings=8192, vocab_size=128256,
                 rope_scaling={"rope_type": "llama3", "factor": 8.0,
                               "original_max_position_embeddings": 8192},
                 torch_dtype="bfloat16", transformers_version="4.57.0")


@dataclasses.dataclass
class CacheConfig:
    block_size: Optional[int] = None  # vLLM: set from the platform when not given
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    prefix_caching_hash_algo: str = "sha256"
    hash_block_size: Optional[int] = None


@dataclasses.dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclasses.dataclass
class KVEventsConfig:
    enable_kv_cache_events: bool = False
    publisher: Optional[str] = None  # vLLM: "zmq" when events are on, else "null"
    endpoint: str = "tcp://*:5557"
    replay_endpoint: Optional[str] = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self):
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"


@dataclasses.dataclass
class VllmConfig:
    model_config: Optional[ModelConfig] = None
    cache_config: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    parallel_config: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    kv_transfer_config: Optional[KVTransferConfig] = None
    kv_events_config: Optional[KVEventsConfig] = None


@dataclasses.dataclass
class KVCacheGroupSpec:
    layer_names: list
    kv_cache_spec: Any


# The KV-cache specs of a hybrid model's groups (vllm/v1/kv_cache_interface.py).  vLLM's
# spec_manager_map picks each group's manager by the spec's class: FullAttentionSpec never
# skips a position; SlidingWindowSpec, ChunkedLocalAttentionSpec and MambaSpec do, and
# their groups hold vLLM's null block (block 0) where they skip
# (single_type_kv_cache_manager.py, get_num_skipped_tokens; hybrid_block_ids below).


@dataclasses.dataclass(frozen=True, kw_only=True)
class FullAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: Optional[int] = None
    attention_chunk_size: Optional[int] = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    sliding_window: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec:
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: Any
    attention_chunk_size: int


@dataclasses.dataclass(frozen=True)
class MambaSpec:
    block_size: int
    shapes: tuple
    dtypes: tuple
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0


def skipped_tokens(spec, num_computed_tokens):
    """get_num_skipped_tokens of the spec's manager, as vLLM main computes it."""
    if isinstance(spec, SlidingWindowSpec):
        return max(0, num_computed_tokens - spec.sliding_window + 1)
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return (num_computed_tokens // spec.attention_chunk_size) * spec.attention_chunk_size
    if isinstance(spec, MambaSpec):
        return num_computed_tokens - 1
    return 0


def hybrid_block_ids(specs, block_ids, num_computed_tokens, block_size):
    """A request's block ids per group as vLLM hands them to a connector: in each group,
    the first get_num_skipped_tokens(computed) // block_size positions hold the null block
    (block 0: allocate_new_computed_blocks pads a new request's skipped positions with it,
    remove_skipped_blocks replaces those a running request leaves behind)."""
    out = []
    for spec, ids in zip(specs, block_ids):
        skipped = max(0, skipped_tokens(spec, num_computed_tokens)) // block_size
        out.append([0 if i < skipped else b for i, b in enumerate(ids)])
    return tuple(out)


class BlockPool:
    """vLLM's BlockPool, as far as a Mamba manager's allocation reaches: block ids are
    ints, block 0 is the null block, new blocks are handed out in order."""

    def __init__(self, num_gpu_blocks: int, enable_caching: bool, hash_block_size: int,
                 enable_kv_cache_events: bool = False, metrics_collector=None):
        self.num_gpu_blocks = num_gpu_blocks
        self.null_block = 0
        self._free = list(range(1, num_gpu_blocks))
        self.freed = []  # what free_blocks gave back, in order (for the tests)

    def get_new_blocks(self, num_blocks: int) -> list:
        taken, self._free = self._free[:num_blocks], self._free[num_blocks:]
        return taken

    def free_blocks(self, ordered_blocks) -> None:
        self.freed.extend(ordered_blocks)
        self._free.extend(ordered_blocks)


class MambaManager:
    """vLLM main's MambaManager (vllm/v1/core/single_type_kv_cache_manager.py), the part
    that decides a request's block list: get_num_skipped_tokens, remove_skipped_blocks
    (with the base class's loop) and allocate_new_blocks, in "align" mode with
    speculative blocks -- each step's running state in the last block before the
    num_speculative_blocks speculative ones, which the next step reuses: one that falls
    inside the skipped positions is moved to the end and the null block takes its place.
    In other modes, the base class's allocation (with the speculative blocks added)."""

    def __init__(self, kv_cache_spec: MambaSpec, block_pool: BlockPool, **kwargs):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self._null_block = block_pool.null_block
        self.req_to_blocks = collections.defaultdict(list)
        self.mamba_cache_mode = kv_cache_spec.mamba_cache_mode
        self.num_speculative_blocks = kv_cache_spec.num_speculative_blocks
        if self.mamba_cache_mode == "align":
            self.last_state_block_idx = {}
            self._allocated_block_reqs = set()

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return num_computed_tokens - 1

    def remove_skipped_blocks(self, request_id: str, num_computed_tokens: int) -> None:
        # Async scheduling may count draft tokens not yet verified: assume none is.
        num_computed_tokens = max(0, num_computed_tokens - self.num_speculative_blocks)
        skipped = self.get_num_skipped_tokens(num_computed_tokens)
        blocks = self.req_to_blocks[request_id]
        if skipped > 0:
            removed = []
            for i in range(min(skipped // self.block_size, len(blocks)) - 1, -1, -1):
                if blocks[i] == self._null_block:
                    break
                removed.append(blocks[i])
                blocks[i] = self._null_block
            self.block_pool.free_blocks(removed)
        if self.mamba_cache_mode == "align":
            # The state block of two steps ago: the last step's was copied from it.
            last = self.last_state_block_idx.get(request_id)
            if last is not None and last < -(-num_computed_tokens // self.block_size) - 1:
                if blocks[last] != self._null_block:
                    self.block_pool.free_blocks([blocks[last]])
                    blocks[last] = self._null_block

    def allocate_new_blocks(self, request_id: str, num_tokens: int,
                            num_tokens_main_model: int) -> list:
        req_blocks = self.req_to_blocks[request_id]
        if self.mamba_cache_mode != "align":
            num_tokens += self.block_size * self.num_speculative_blocks
            need = -(-num_tokens // self.block_size) - len(req_blocks)
            new = self.block_pool.get_new_blocks(need) if need > 0 else []
            req_blocks.extend(new)
            return new
        # No blocks for lookahead (draft) tokens: they would break the alignment.
        required = -(-num_tokens_main_model // self.block_size) + self.num_speculative_blocks
        if required == len(req_blocks):
            return []
        assert required > len(req_blocks), (required, len(req_blocks))
        prev = len(req_blocks)
        allocated = request_id in self._allocated_block_reqs
        if allocated:
            self.last_state_block_idx[request_id] = prev - 1 - self.num_speculative_blocks
        elif prev > 0:
            self.last_state_block_idx[request_id] = prev - 1  # a prefix hit's state
        skipped_blocks = required - self.num_speculative_blocks - 1
        if prev < skipped_blocks:
            req_blocks.extend([self._null_block] * (skipped_blocks - prev))
        if allocated:
            for idx in range(prev - self.num_speculative_blocks, prev):
                if idx >= skipped_blocks:
                    break
                req_blocks.append(req_blocks[idx])  # reused at the end
                req_blocks[idx] = self._null_block
        need = required - len(req_blocks)
        assert need <= (1 if allocated else self.num_speculative_blocks + 1), need
        req_blocks.extend(self.block_pool.get_new_blocks(need))
        self._allocated_block_reqs.add(request_id)
        return req_blocks[prev:]

    def free(self, request_id: str) -> None:
        if self.mamba_cache_mode == "align":
            self._allocated_block_reqs.discard(request_id)
            self.last_state_block_idx.pop(request_id, None)
        self.block_pool.free_blocks(reversed(self.req_to_blocks.pop(request_id, [])))


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
                policy="fail", revision=None, hf_overrides=None, role="kv_both", **extra):
    """A VllmConfig as `vllm serve --kv-transfer-config` makes it for this connector; the
    model's config is HF_CONFIG with hf_overrides applied, as vLLM applies them."""
    extra = dict(extra, path=path)
    extra.setdefault("options", dict(memory_capacity_bytes="64MiB", prefault_memory=False))
    transfer = KVTransferConfig(kv_connector="KVEngineConnector", kv_role=role,
                                kv_connector_module_path="kvengine.vllm.connector",
                                kv_connector_extra_config=extra, kv_load_failure_policy=policy)
    model_config = ModelConfig(model=model, dtype=dtype, revision=revision,
                               hf_overrides=dict(hf_overrides or {}))
    hf = types.SimpleNamespace(**dict(HF_CONFIG, **model_config.hf_overrides))
    model_config.hf_config = model_config.hf_text_config = hf
    return VllmConfig(model_config, CacheConfig(block_size=block_size), ParallelConfig(),
                      transfer)


# ------------------------------------------------------------------ block hashes


def _sha256(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def init_none_hash(environ=None):
    """NONE_HASH of one engine process: from PYTHONHASHSEED, else 32 random bytes."""
    seed = (os.environ if environ is None else environ).get("PYTHONHASHSEED")
    return os.urandom(32) if seed is None else _sha256(seed)


def block_hashes(token_ids, block_size, none_hash, lora_name=None, cache_salt=None):
    """vLLM's chained block hashes, with its extra keys (generate_block_hash_extra_keys):
    the LoRA name in every block, the cache salt in the first."""
    hashes, parent = [], none_hash
    for i in range(len(token_ids) // block_size):
        chunk = tuple(token_ids[i * block_size:(i + 1) * block_size])
        extra = ([lora_name] if lora_name else []) + (
            [cache_salt] if i == 0 and cache_salt else [])
        parent = _sha256((parent, chunk, tuple(extra) if extra else None))
        hashes.append(parent)
    return hashes


@dataclasses.dataclass
class LoRARequest:
    """vllm/lora/request.py (a msgspec.Struct there)."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    base_model_name: Optional[str] = None


class Request:
    def __init__(self, request_id, prompt_token_ids, block_size, none_hash, cache_salt=None,
                 lora_request=None):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.all_token_ids = list(prompt_token_ids)
        self.num_computed_tokens = 0
        self.mm_features = []
        self.sampling_params = None
        self.pooling_params = None
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.prompt_embeds = None
        self.status = "WAITING"
        self._block_size = block_size
        self._none_hash = none_hash
        self.block_hashes = []
        self.num_publishable_block_hashes = 0
        self.update_block_hashes()

    def update_block_hashes(self):
        lora = self.lora_request.lora_name if self.lora_request else None
        self.block_hashes = block_hashes(self.all_token_ids, self._block_size, self._none_hash,
                                         lora, self.cache_salt)
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


def _groups(block_ids):
    """Block ids per KV-cache group, as vLLM passes them (tuple[list[int], ...]): a tuple
    of lists is one list per group; a flat list, the ids of a model with one group."""
    if isinstance(block_ids, tuple) and block_ids and isinstance(block_ids[0], list):
        return tuple(list(g) for g in block_ids)
    return (list(block_ids),)


class KVCacheBlocks:
    def __init__(self, block_ids):
        self._ids = _groups(block_ids)

    def get_block_ids(self):
        return tuple(list(g) for g in self._ids)


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
    # Whether a scheduled request consumes KV the connector loads synchronously this step
    # (get_num_new_matched_tokens said load_async=False): the model runner then starts the
    # loads before the forward, otherwise after it (run_worker_step's sync_loads).
    has_sync_kv_loads: bool = False
    ec_connector_metadata: Any = None

    @classmethod
    def make_empty(cls):
        return cls([], CachedRequestData.make_empty(), {}, 0, {}, {}, [], set(), [])


def new_step(new=(), cached=None, finished=(), preempted=None):
    """new: [(request, block_ids, num_computed_tokens, num_scheduled_tokens)]."""
    new_reqs, sched = [], {}
    for req, ids, computed, scheduled in new:
        new_reqs.append(NewRequestData(req.request_id, req.prompt_token_ids, [], None, None,
                                       _groups(ids), computed, None))
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
#
# vLLM's metrics path for a KV connector, as on vLLM main: the engine front end's
# PrometheusStatLogger (vllm/v1/metrics/loggers.py) builds KVConnectorProm with
# labelnames ["model_name", "engine"] and one label-value list per engine, and feeds it
# SchedulerStats.kv_connector_stats -- the connector stats' to_dict() after the trip from
# the engine core (for MultiConnector: {child class name: that child's to_dict()}).  The metric
# classes are prometheus_client's own; each test gets a registry of its own.

try:
    import prometheus_client  # Debian's python3-prometheus-client
except ImportError:  # the metrics tests skip, saying why
    prometheus_client = None

VLLM_LABELNAMES = ["model_name", "engine"]


def per_engine_labelvalues(model, engines):
    """What PrometheusStatLogger passes: {engine index: [model name, str(index)]}."""
    return {idx: [model, str(idx)] for idx in engines}


def metric_types(registry):
    """vLLM's metric_types ({Gauge: cls, Counter: cls, Histogram: cls}), with classes
    that register into `registry` instead of the process-wide default one."""
    def bound(base):
        return type(base.__name__, (base,), {
            "__init__": lambda self, *a, **kw: base.__init__(self, *a, registry=registry, **kw)})
    return {compat.Gauge: bound(prometheus_client.Gauge),
            compat.Counter: bound(prometheus_client.Counter),
            compat.Histogram: bound(prometheus_client.Histogram)}


def prom_logger_class(registry):
    """KVConnectorProm with metric classes bound to `registry`, as vLLM's tests subclass
    its stat loggers (the class attributes _gauge_cls, _counter_cls, _histogram_cls)."""
    types = metric_types(registry)
    return type("KVConnectorProm", (KVConnectorProm,), {
        "_gauge_cls": types[compat.Gauge], "_counter_cls": types[compat.Counter],
        "_histogram_cls": types[compat.Histogram]})


class KVConnectorFactory:
    """vllm/distributed/kv_transfer/kv_connector/factory.py: the registry by name, and
    the class of a KVTransferConfig (its module path first, then the registry)."""
    _registry: dict = {}

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")

        def loader():
            return getattr(importlib.import_module(module_path), class_name)
        cls._registry[name] = loader

    @classmethod
    def get_connector_class_by_name(cls, connector_name: str):
        if connector_name not in cls._registry:
            raise ValueError(f"Connector '{connector_name}' is not registered.")
        return cls._registry[connector_name]()

    @classmethod
    def get_connector_class(cls, kv_transfer_config):
        connector_name = kv_transfer_config.kv_connector
        if connector_name is None:
            raise ValueError("Connector name is not set in KVTransferConfig")
        module_path = kv_transfer_config.kv_connector_module_path
        if module_path is not None and not module_path:
            raise ValueError("kv_connector_module_path cannot be an empty string.")
        if module_path:
            return getattr(importlib.import_module(module_path), connector_name)
        if connector_name in cls._registry:
            return cls._registry[connector_name]()
        raise ValueError(f"Unsupported connector type: {connector_name}")


KVConnectorFactory.register_connector("MultiConnector", __name__, "MultiConnector")


class KVConnectorProm:
    """vllm/distributed/kv_transfer/kv_connector/v1/metrics.py: asks the configured
    connector's class for its metrics, then forwards each engine's stats to them."""
    _gauge_cls = getattr(prometheus_client, "Gauge", None)
    _counter_cls = getattr(prometheus_client, "Counter", None)
    _histogram_cls = getattr(prometheus_client, "Histogram", None)

    def __init__(self, vllm_config, labelnames: list, per_engine_labelvalues: dict):
        self.prom_metrics = None
        kv_transfer_config = vllm_config.kv_transfer_config
        if kv_transfer_config and kv_transfer_config.kv_connector:
            connector_cls = KVConnectorFactory.get_connector_class(kv_transfer_config)
            metric_types = {compat.Gauge: self._gauge_cls, compat.Counter: self._counter_cls,
                            compat.Histogram: self._histogram_cls}
            self.prom_metrics = connector_cls.build_prom_metrics(
                vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        if self.prom_metrics is None:
            return
        self.prom_metrics.observe(transfer_stats_data, engine_idx)


@dataclasses.dataclass
class MultiKVConnectorStats(compat.KVConnectorStats):
    """multi_connector.py: one stats object per connector class name."""

    def to_dict(self) -> dict:
        return {connector_id: stats.to_dict() for connector_id, stats in self.data.items()}

    def aggregate(self, other):
        for connector_id, stats in other.data.items():
            if connector_id not in self.data:
                self[connector_id] = stats
            else:
                assert isinstance(stats, type(self.data[connector_id]))
                self[connector_id] = self[connector_id].aggregate(stats)
        return self

    def reset(self):
        for stats in self.data.values():
            stats.reset()

    def reduce(self) -> dict:
        return {connector_id: stats.reduce() for connector_id, stats in self.data.items()}

    def is_empty(self) -> bool:
        return all(stats.is_empty() for stats in self.data.values())

    def __getitem__(self, connector_id: str):
        return self.data[connector_id]

    def __setitem__(self, connector_id: str, stats):
        self.data[connector_id] = stats


class MultiKVConnectorPromMetrics(compat.KVConnectorPromMetrics):
    """multi_connector.py: each child's metrics observe that child's shipped stats (its
    to_dict(), the data itself)."""

    def __init__(self, vllm_config, metric_types: dict, labelnames: list,
                 per_engine_labelvalues: dict, prom_metrics: dict):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._prom_metrics = prom_metrics

    def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
        for connector_id, stats_data in transfer_stats_data.items():
            assert connector_id in self._prom_metrics, (
                f"{connector_id} is not contained in the list of registered connectors "
                f"with Prometheus metrics support: {self._prom_metrics.keys()}")
            self._prom_metrics[connector_id].observe(stats_data, engine_idx)


class MultiConnector:
    """multi_connector.py's MultiConnector: only its class-level members, the ones vLLM's
    metrics path and CUDA-graph check call (the tests drive no MultiConnector instance)."""

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict) -> bool:
        for conn_config in extra_config.get("connectors", []):
            connector_cls = KVConnectorFactory.get_connector_class(KVTransferConfig(**conn_config))
            child_extra_config = conn_config.get("kv_connector_extra_config", {})
            if connector_cls.requires_piecewise_for_cudagraph(child_extra_config):
                return True
        return False

    @classmethod
    def _get_connector_classes_and_configs(cls, vllm_config) -> list:
        assert vllm_config.kv_transfer_config is not None
        ktcs = vllm_config.kv_transfer_config.kv_connector_extra_config.get("connectors")
        assert ktcs is not None
        ret = []
        for ktc in ktcs:
            temp_config = copy.copy(vllm_config)
            engine_id = ktc.get("engine_id", vllm_config.kv_transfer_config.engine_id)
            temp_config.kv_transfer_config = KVTransferConfig(**ktc, engine_id=engine_id)
            ret.append((KVConnectorFactory.get_connector_class(temp_config.kv_transfer_config),
                        temp_config))
        return ret

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None):
        if data is None:
            return MultiKVConnectorStats()
        reconstructed_data = {}
        for connector_name, stats_value in data.items():
            if isinstance(stats_value, compat.KVConnectorStats):
                reconstructed_data[connector_name] = stats_value
                continue
            connector_cls = KVConnectorFactory.get_connector_class_by_name(connector_name)
            if reconstructed := connector_cls.build_kv_connector_stats(data=stats_value):
                reconstructed_data[connector_name] = reconstructed
        return MultiKVConnectorStats(data=reconstructed_data)

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types: dict, labelnames: list,
                           per_engine_labelvalues: dict):
        prom_metrics = {}
        seen_classes = set()
        for connector_cls, temp_config in cls._get_connector_classes_and_configs(vllm_config):
            if connector_cls in seen_classes:
                continue
            seen_classes.add(connector_cls)
            connector_prom = connector_cls.build_prom_metrics(
                temp_config, metric_types, labelnames, per_engine_labelvalues)
            if connector_prom is not None:
                prom_metrics[connector_cls.__name__] = connector_prom
        return MultiKVConnectorPromMetrics(vllm_config, metric_types, labelnames,
                                           per_engine_labelvalues, prom_metrics)


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


def make_state_cache(spec, num_blocks=16):
    """A Mamba layer's cache as vLLM main's model runner hands it to a connector
    (gpu_model_runner._reshape_kv_cache_tensors): one buffer of num_blocks pages of
    page_size_bytes, viewed as one (num_blocks, *shape) tensor per state, the states of a
    block side by side in its page."""
    sizes = [int(torch.empty(shape, dtype=dtype).numel()) * torch.empty((), dtype=dtype)
             .element_size() for shape, dtype in zip(spec.shapes, spec.dtypes)]
    page = sum(sizes)
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8)
    out, offset = [], 0
    for shape, dtype, size in zip(spec.shapes, spec.dtypes, sizes):
        elt = torch.empty((), dtype=dtype).element_size()
        inner = torch.empty(shape).stride()
        out.append(torch.as_strided(raw.view(dtype), (num_blocks, *shape),
                                    (page // elt, *inner), offset // elt))
        offset += size
    return out


def block_view(cache, layout, block_id):
    """Everything one block holds in one layer (K and V; a Mamba layer's states, as one
    byte tensor)."""
    if isinstance(cache, (list, tuple)):
        return torch.cat([t[block_id].reshape(-1).view(torch.uint8) for t in cache])
    if layout == "flash_legacy":
        return cache[:, block_id]
    return cache[block_id]


def fill_block(caches, layout, block_id, block_hash):
    """'Computes' a block: deterministic contents from its hash, different per layer."""
    for i, cache in enumerate(caches.values()):
        g = torch.Generator().manual_seed(int.from_bytes(block_hash[:6], "little") + i)
        for view in ([t[block_id] for t in cache] if isinstance(cache, (list, tuple))
                     else [block_view(cache, layout, block_id)]):
            view.copy_(torch.randn(view.shape, generator=g).to(view.dtype))


def run_worker_step(worker, meta, caches, layout, compute=(), keep_bound=False,
                    sync_loads=True):
    """One forward pass on the worker as vLLM runs it (vllm/v1/worker/
    kv_connector_model_runner_mixin.py): start_load_kv, then per layer
    wait_for_layer_load, attention (here: 'computing' blocks) and save_kv_layer, then
    wait_for_save; the metadata crosses a process boundary (pickled).  sync_loads is the
    step's SchedulerOutput.has_sync_kv_loads: without a synchronous load vLLM starts the
    loads after the forward instead (before wait_for_save), so the layers' waits come
    before start_load_kv.  keep_bound: the metadata stays bound, for the output vLLM
    collects before it clears it (worker_output)."""
    meta = pickle.loads(pickle.dumps(meta))
    worker.bind_connector_metadata(meta)
    if sync_loads:
        worker.start_load_kv(Forward())
    for name, cache in caches.items():
        worker.wait_for_layer_load(name)
        if name == next(iter(caches)):
            for block_id, block_hash in compute:
                fill_block(caches, layout, block_id, block_hash)
        worker.save_kv_layer(name, cache, None)
    if not sync_loads:
        worker.start_load_kv(Forward())
    worker.wait_for_save()
    if not keep_bound:
        worker.clear_connector_metadata()
    return meta


# ------------------------------------------------------------------ KV events, vLLM's path
# vllm/v1/outputs.py: what each worker returns; vllm/distributed/kv_transfer/kv_connector/
# utils.py: KVOutputAggregator merging the workers' outputs; the scheduler's handling in
# vllm/v1/core/sched/scheduler.py (update_from_output), modelled by publish_events.


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: Optional[set] = None
    finished_recving: Optional[set] = None
    kv_connector_stats: Any = None
    kv_cache_events: Any = None
    kv_connector_worker_meta: Any = None
    invalid_block_ids: set = dataclasses.field(default_factory=set)
    failed_recving: set = dataclasses.field(default_factory=set)
    expected_finished_count: int = 0
    prefix_replay_checkpoints: dict = dataclasses.field(default_factory=dict)

    def is_empty(self):
        return (not self.finished_sending and not self.finished_recving
                and not self.prefix_replay_checkpoints
                and not self.kv_connector_stats and not self.kv_cache_events
                and not self.invalid_block_ids and not self.failed_recving
                and not self.kv_connector_worker_meta)


@dataclasses.dataclass
class ModelRunnerOutput:
    req_ids: list
    req_id_to_index: dict
    kv_connector_output: Optional[KVConnectorOutput] = None


def worker_output(connector, finished_req_ids=()):
    """What vLLM's KVConnectorModelRunnerMixin collects from a worker's connector at the
    end of its step (before clear_connector_metadata)."""
    out = KVConnectorOutput()
    results = connector.get_transfer_results(set(finished_req_ids))
    out.finished_sending = results.finished_sending
    out.finished_recving = results.finished_recving
    out.failed_recving = results.failed_recving
    out.prefix_replay_checkpoints = results.prefix_replay_checkpoints
    out.invalid_block_ids = connector.get_block_ids_with_load_errors()
    out.kv_connector_stats = connector.get_kv_connector_stats()
    out.kv_cache_events = connector.get_kv_connector_kv_cache_events()
    out.kv_connector_worker_meta = connector.build_connector_worker_meta()
    return ModelRunnerOutput(req_ids=[], req_id_to_index={}, kv_connector_output=out)


class KVOutputAggregator:
    """vLLM's merge of the workers' outputs into rank 0's (the events part as vLLM does
    it: the first worker's object is the accumulator; each later non-empty one adds its
    events and one worker)."""

    def __init__(self, expected_finished_count: int):
        self._recv_remaining_count = {}
        self._send_remaining_count = {}
        self._expected_finished_count = expected_finished_count

    @classmethod
    def from_connector(cls, connector, world_size: int):
        return cls(connector.get_finished_count() or world_size)

    def aggregate(self, outputs: list, output_rank: int = 0):
        if not outputs[output_rank]:
            return None
        stats = None
        events = None
        invalid = set()
        for model_runner_output in outputs:
            kv_output = model_runner_output.kv_connector_output
            if not kv_output:
                continue
            if stats is None:
                stats = kv_output.kv_connector_stats
            elif kv_output.kv_connector_stats:
                stats = stats.aggregate(kv_output.kv_connector_stats)
            if events is None:
                events = kv_output.kv_cache_events
            elif kv_cache_events := kv_output.kv_cache_events:
                assert isinstance(events, type(kv_cache_events))
                events.add_events(kv_cache_events.get_all_events())
                events.increment_workers(1)
            invalid |= kv_output.invalid_block_ids
        output = outputs[output_rank]
        output.kv_connector_output = KVConnectorOutput(
            kv_connector_stats=stats or None, kv_cache_events=events or None,
            invalid_block_ids=invalid,
            expected_finished_count=self._expected_finished_count)
        return output


def publish_events(scheduler_connector, aggregated_output):
    """The scheduler's end of a step (update_from_output): the connector sees the merged
    output, then its take_events are published as one KVEventBatch, encoded as vLLM's
    ZmqEventPublisher encodes it (msgspec's msgpack encoder).  Returns (batch, payload),
    (None, None) when there was nothing to publish."""
    import time

    import msgpack

    kv_output = aggregated_output.kv_connector_output if aggregated_output else None
    if kv_output:
        scheduler_connector.update_connector_output(kv_output)
    events = None
    connector_events = scheduler_connector.take_events()
    if connector_events:
        events = list(connector_events)
    if not events:
        return None, None
    batch = compat.KVEventBatch(ts=time.time(), events=events)
    return batch, msgpack.packb(compat.to_builtins(batch), use_bin_type=True)
