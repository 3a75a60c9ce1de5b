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
"""

import dataclasses
import logging
from typing import Any, Optional

import kvengine

from ..load_planning import planner_kwargs

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
        }
        return Plan(n, shares, estimate)

    def prefetching(self, started_keys):
        """A prefetch started reading `started_keys` keys up from SSD."""
        if self._planner is not None and started_keys and self._key_bytes:
            self._planner.add_in_flight(kvengine.LOCATED_SSD, started_keys * self._key_bytes)

    def record(self, stats: Any):
        """The load samples of the workers' stats of a step (KVEngineConnectorStats)."""
        data = getattr(stats, "data", None)
        if self._planner is None or not isinstance(data, dict):
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
