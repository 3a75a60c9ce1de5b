"""The load planner on the connector's scheduler side: how many of a request's hit blocks
to load, so that loading them is no slower than vLLM computing them (kvengine.LoadPlanner,
include/kvengine/load_planner.h; docs/vllm.md, "Never slower than recompute").

kv_connector_extra_config: "load_planner", "recompute_tokens_per_s" and
"load_planner_options", as kvengine/load_planning.py reads them; overlap_layers defaults
to this instance's layers, as the worker loads layer by layer while vLLM computes.

Each rank loads its own keys at the same time as the others, so a plan weighs a key at
its bytes over the number of ranks: the time it predicts is one rank's.  The workers
measure each step's load (seconds, and the planned blocks' bytes split by the tiers the
lookup found them in) and send it back in the connector's stats ("load_samples"), which
vLLM hands the scheduler side with the step's output (update_connector_output).

The prefill rate, when kv_connector_extra_config does not state it, is learned the same
way: the scheduler side marks each step that computes prompt tokens with the tokens the
step computes (the metadata's step_tokens), the worker of rank (tp 0, pp 0) times that
step's forward pass -- from start_load_kv to wait_for_save, on the GPU's clock where the
caches are on CUDA (StepTimer) -- and sends [tokens, seconds] back in the stats
("step_samples"), which the scheduler side fits the rate to (LoadPlanner.record_prefill).
A step that loads from the store is not timed: its forward waits for the loads.
"""

import collections
import dataclasses
import logging
import time
from typing import Any, Optional

import kvengine

from ..load_planning import planner_kwargs
from .common import attr_of

logger = logging.getLogger("kvengine.vllm")

_TIER_NAMES = {kvengine.LOCATED_MEMORY: "memory", kvengine.LOCATED_SSD: "ssd",
               kvengine.LOCATED_PEER: "peer"}


@dataclasses.dataclass
class Plan:
    """One request's plan: load the first load_blocks of its hit blocks."""

    load_blocks: int
    # The planned blocks' bytes by tier (memory, ssd, peer), as shares of 1.
    tier_shares: Optional[tuple]
    # What decided it, for the request account (milliseconds).
    estimate: dict


def planner_config(extra) -> Optional[dict]:
    """kvengine.LoadPlanner's keyword arguments from kv_connector_extra_config
    (kvengine/load_planning.py); None when the planner is off."""
    return planner_kwargs(extra, "kv_connector_extra_config")


class SchedulerPlanner:
    """The scheduler side's planner: plans lookups, counts the prefetch it starts, and
    follows the workers' measured loads.  Called from vLLM's scheduler thread only."""

    def __init__(self, kwargs: dict, db, keys):
        self._kwargs = dict(kwargs)
        self._db = db
        self._keys = keys
        self._planner = None  # built at the first plan, when the layers are known
        self._key_bytes = None  # one key's bytes over the number of ranks
        # No rate stated: the workers' timed steps teach it (the module docstring).
        self.learns_rate = kwargs.get("recompute_tokens_per_s") is None
        # Steps timed before the first plan built the planner (the newest kept).
        self._early_steps = collections.deque(maxlen=64)

    def _ready(self, block_keys, keys_per_block):
        if self._key_bytes is None:
            size = self._db.get_size(block_keys[0])
            if size <= 0:
                return False  # gone since the lookup: plan the next one
            ranks = len(self._keys.ranks())
            self._key_bytes = max(1, -(-size // ranks))
        if self._planner is None:
            kwargs = dict(self._kwargs)
            # The worker loads layer by layer and vLLM computes the rest meanwhile.
            kwargs.setdefault("overlap_layers",
                              max(1, keys_per_block // len(self._keys.ranks())))
            self._planner = kvengine.LoadPlanner(**kwargs)
            for tokens, seconds in self._early_steps:
                self._planner.record_prefill(tokens, seconds)
            self._early_steps.clear()
        return True

    def plan(self, located, request_tokens) -> Optional[Plan]:
        """located: (keys, batch_locate results) of each hit block, in order; None when
        the planner cannot plan it (every hit is then loaded)."""
        keys_per_block = len(located[0][0])
        tiers = [r for _, results in located for r in results]
        # An owner without batch_locate answered batch_is_exist's way: no tiers to plan by.
        if any(r not in _TIER_NAMES for r in tiers):
            return None
        if not self._ready(located[0][0], keys_per_block):
            return None
        p = self._planner.plan(tiers, keys_per_block, self._key_bytes, self._keys.block_size,
                               max(0, request_tokens))
        n = p["load_blocks"]
        counts = [0, 0, 0]
        for r in tiers[:n * keys_per_block]:
            counts[r - 1] += 1
        total = sum(counts)
        shares = tuple(c / total for c in counts) if total else None
        cut = tiers[n * keys_per_block:]
        estimate = {
            "load_ms": round((p["all_hits_load_s"] - p["load_s"]) * 1000.0, 3),
            "recompute_ms": round((p["all_hits_recompute_s"] - p["recompute_s"]) * 1000.0, 3),
            "ttft_ms": round(p["planned_ttft_s"] * 1000.0, 3),
            "ttft_ms_loading_all": round(p["all_hits_ttft_s"] * 1000.0, 3),
            "tiers": sorted({_TIER_NAMES[r] for r in cut}),
            # The prefill rate it planned with, and whence: kv_connector_extra_config's,
            # or learned from the workers' timed steps (None: unknown, every hit loaded).
            "recompute_tokens_per_s": (round(self._planner.recompute_tokens_per_s)
                                       if p["rate_known"] else None),
            "rate": "learned" if self.learns_rate else "configured",
        }
        return Plan(n, shares, estimate)

    def prefetching(self, started_keys):
        """A prefetch started reading `started_keys` keys up from SSD."""
        if self._planner is not None and started_keys and self._key_bytes:
            self._planner.add_in_flight(kvengine.LOCATED_SSD, started_keys * self._key_bytes)

    def step_tokens(self, scheduler_output) -> int:
        """What the workers time this step for the prefill rate: the tokens it computes,
        when it computes prompt tokens and the rate is learned; else 0 (not timed)."""
        return prefill_step_tokens(scheduler_output) if self.learns_rate else 0

    def record(self, stats: Any):
        """The load and step samples of the workers' stats of a step
        (KVEngineConnectorStats)."""
        data = getattr(stats, "data", None)
        if not isinstance(data, dict):
            return
        if self.learns_rate:
            for sample in data.get("step_samples", ()):
                try:
                    tokens, seconds = int(sample[0]), float(sample[1])
                    if self._planner is None:
                        if tokens > 0 and seconds > 0:
                            self._early_steps.append((tokens, seconds))
                    else:
                        self._planner.record_prefill(tokens, seconds)
                except (ValueError, TypeError, IndexError) as e:
                    logger.debug("kvengine: step sample %r not used: %s", sample, e)
        if self._planner is None:
            return
        for sample in data.get("load_samples", ()):
            try:
                self._planner.record_load(int(sample[0]), int(sample[1]), int(sample[2]),
                                          float(sample[3]))
            except (ValueError, TypeError, IndexError) as e:
                logger.debug("kvengine: load sample %r not used: %s", sample, e)


def load_sample(transfers, loaded_blocks, block_bytes, seconds):
    """[memory, ssd, peer bytes, seconds] of one load job, from the tier shares its
    transfers were planned with and the blocks of each it loaded; None without shares."""
    by_tier = [0.0, 0.0, 0.0]
    for transfer, blocks in zip(transfers, loaded_blocks):
        shares = getattr(transfer, "tier_shares", None)
        if not shares or not blocks:
            continue
        for t in range(3):
            by_tier[t] += shares[t] * blocks * block_bytes
    if not any(by_tier) or seconds <= 0:
        return None
    return [int(b) for b in by_tier] + [seconds]


def prefill_step_tokens(scheduler_output) -> int:
    """The tokens a step computes (vLLM's total_num_scheduled_tokens) when a request of
    it computes prompt tokens -- more tokens than one plus its speculative ones -- else 0:
    a step of decodes alone is bound by reading the KV cache, not by the prefill rate."""
    scheduled = attr_of(scheduler_output, "num_scheduled_tokens", None) or {}
    spec = attr_of(scheduler_output, "scheduled_spec_decode_tokens", None) or {}
    if not any(n > 1 + len(spec.get(req_id, ())) for req_id, n in scheduled.items()):
        return 0
    return int(attr_of(scheduler_output, "total_num_scheduled_tokens", 0) or 0)


class StepTimer:
    """The worker's timing of the forward steps the scheduler side marked (step_tokens):
    from start_load_kv to wait_for_save.  On CUDA the forward runs asynchronously to the
    Python that launched it, so the step is timed by CUDA events recorded on the current
    stream at both ends and read once the GPU has passed the second (a later step);
    elsewhere by the wall clock.  Steps with loads are not timed (their forward waits for
    the store)."""

    _MAX_PENDING = 16  # CUDA steps timed but not yet finished on the GPU (the newest kept)

    def __init__(self, record):
        self._record = record  # the connector's interval stats (step_samples=...)
        self._step = None  # (tokens, on CUDA, start: perf_counter or CUDA event)
        self._pending = collections.deque(maxlen=self._MAX_PENDING)

    def start(self, meta, on_cuda: bool):
        """At start_load_kv, with the step's metadata; on_cuda: the caches are CUDA's."""
        tokens = int(getattr(meta, "step_tokens", 0) or 0) if meta is not None else 0
        self._step = None
        if tokens <= 0 or getattr(meta, "loads", None):
            return
        if on_cuda:
            import torch

            start = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.perf_counter()
        self._step = (tokens, on_cuda, start)

    def stop(self):
        """At wait_for_save: the step's time, or (CUDA) its end event to read later."""
        step, self._step = self._step, None
        if step is not None:
            tokens, on_cuda, start = step
            if on_cuda:
                import torch

                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._pending.append((tokens, start, end))
            else:
                self._sample(tokens, time.perf_counter() - start)
        while self._pending and self._pending[0][2].query():
            tokens, start, end = self._pending.popleft()
            self._sample(tokens, start.elapsed_time(end) / 1000.0)

    def _sample(self, tokens, seconds):
        if seconds > 0:
            self._record(step_samples=[tokens, seconds])
