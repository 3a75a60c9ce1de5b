"""KVEngineScheduler: the connector's scheduler side (vLLM's scheduler process).

get_num_new_matched_tokens asks the store (one batch_locate over the request's remaining
blocks, every layer of every rank) for the longest present prefix and where each key of it
is; the load planner (planner.py) cuts it to the blocks that load no slower than vLLM
would compute them; and the store is asked to start bringing that planned prefix up from
SSD (batch_prefetch) while vLLM allocates and schedules, so that the worker's load finds
it in memory (kv_connector_extra_config "prefetch": True by default); build_connector_meta
turns the step's scheduler output into the picklable metadata the workers act on.
"""

import dataclasses
import logging
import os
from typing import Any, Optional

import kvengine

from .common import (BlockTransfer, KeyScheme, KVEngineConnectorMetadata, LayoutRecords,
                     attr_of, block_id_groups, check_fingerprint, tenant_of)
from .events import RemovalFeedReader, Resync
from .nullblocks import NULL_BLOCK_ID, GroupSkips
from .planner import SchedulerPlanner

logger = logging.getLogger("kvengine.vllm")

HASH_SEED_WARNING = (
    "kvengine: PYTHONHASHSEED is not set, so vLLM seeds its block hashes with a random "
    "value in each engine process (init_none_hash): blocks this instance saves are never "
    "found by another vLLM instance or after a restart. Set PYTHONHASHSEED to the same "
    "value (for example PYTHONHASHSEED=0) in the environment of every vLLM instance that "
    "shares this store.")

FAIL_POLICY_WARNING = (
    "kvengine: kv_load_failure_policy is 'fail' (vLLM's default): a block evicted between "
    "the scheduler's lookup and the load fails its request. Set "
    "kv_load_failure_policy='recompute' in kv_transfer_config to recompute it instead.")

_hash_seed_warned = False
NOT_SUPPORTED = -8  # status.h


@dataclasses.dataclass
class _RequestState:
    """Scheduler-side bookkeeping of one request."""

    request: Any
    block_ids: list = dataclasses.field(default_factory=list)  # per group
    saved_blocks: int = 0  # blocks [0, saved_blocks) were handed to the workers to save
    local_computed_tokens: int = 0  # from get_num_new_matched_tokens
    pending_load: Optional[BlockTransfer] = None
    account: Optional[dict] = None  # the lookup's part of a sampled request's account
    tenant: Optional[str] = None  # tenant_of(request)
    # The planned blocks' bytes by tier (memory, ssd, peer), as shares of 1: the worker
    # reports its load's time with them, for the planner's estimates.
    tier_shares: Optional[tuple] = None
    # Hits the planner left to recompute (hashes): saved again once computed (common.py,
    # BlockTransfer.rewrite_hashes).
    rewrite: frozenset = frozenset()


def _hash_hex(h):
    """vLLM's block hash as hex: bytes (BlockHash, sha256), an int (older vLLM, or the
    builtin hash), or an object with hash_value (older BlockHashType)."""
    if isinstance(h, (bytes, bytearray, memoryview)):
        return bytes(h).hex()
    if isinstance(h, str):
        return h
    if isinstance(h, int):
        return "%x" % (h % (1 << 128))
    if hasattr(h, "hash_value"):
        return _hash_hex(h.hash_value)
    raise TypeError("unsupported block hash type %s" % type(h).__name__)


def _extend_moving(ids, new_ids):
    """Appends a running request's new block ids of one group to what it held.  A block
    can sit at one position of a request at a time, so a new id it already holds has
    moved there: vLLM's Mamba "align" mode reuses the previous step's speculative
    blocks (MambaManager.allocate_new_blocks moves each to the end of the request's
    list and puts the null block where it was), and the cached-request data names only
    the ids appended.  Its old position holds the null block now: a save of that
    position must not read the block, whose bytes are a later position's state."""
    if ids:
        moved = {b for b in new_ids if b != NULL_BLOCK_ID}
        for i, b in enumerate(ids):
            if b in moved:
                ids[i] = NULL_BLOCK_ID
    ids.extend(new_ids)


def _request_hashes(request):
    hashes = attr_of(request, "block_hashes", None)
    if hashes is None:
        return []
    return [_hash_hex(h) for h in hashes]


def _publishable(request, count):
    """vLLM main: only the first num_publishable_block_hashes hashes of a request may
    be stored by content (the rest may still change, e.g. EAGLE's draft KV)."""
    limit = attr_of(request, "num_publishable_block_hashes", None)
    return count if limit is None else min(count, int(limit))


class KVEngineScheduler:
    """What the scheduler-side KVEngineConnector does: lookups, the requests' block
    bookkeeping, and each step's metadata.  Called from vLLM's scheduler thread only.

    db is the process's handle on the store (store.acquire_store), record adds to the
    connector's interval stats."""

    def __init__(self, kv_transfer_config: Any, keys: KeyScheme, db, record, events=False,
                 account=None, planner: Optional[SchedulerPlanner] = None,
                 kv_cache_config=None):
        self._keys = keys
        # vLLM's null block in the groups that skip positions (nullblocks.py): a position
        # saved while a group held it lacks that group's keys, and counts as a hit only for
        # a request that skips it in that group too.
        self._skips = GroupSkips(kv_cache_config, keys.block_size)
        self._usable = None  # the last lookup's GroupSkips.usable, None: every key needed
        self._db = db
        self._record = record
        # KV events: the saves carry what BlockStored needs, and each step the feed's
        # newest sequence, up to which every rank reads it (events.py).
        self._events = events
        self._feed = RemovalFeedReader(db, keys) if events else None
        # The replay of the store's blocks for routers that resync (events.Resync).
        self.resync = Resync(db, keys) if events else None
        # The request account (account.py): a LookupAccount, or None when it is off.
        self._account = account
        self._kv_role = attr_of(kv_transfer_config, "kv_role", "kv_both") or "kv_both"
        self._layouts = LayoutRecords(keys)
        self._requests = {}  # req_id -> _RequestState
        extra = attr_of(kv_transfer_config, "kv_connector_extra_config", None) or {}
        self._prefetch = bool(extra.get("prefetch", True))
        # The load planner (planner.py): None when kv_connector_extra_config turns it off.
        self._planner = planner
        self._warn_at_start(kv_transfer_config)
        check_fingerprint(db, keys)

    def _warn_at_start(self, kv_transfer_config):
        global _hash_seed_warned
        # Every configuration shares: the store outlives the process and may be shared by
        # other instances or peers; a random hash seed makes all of that miss.
        if os.environ.get("PYTHONHASHSEED") is None and not _hash_seed_warned:
            _hash_seed_warned = True
            logger.warning(HASH_SEED_WARNING)
        policy = attr_of(kv_transfer_config, "kv_load_failure_policy", None)
        if policy == "fail" and self._is_consumer():
            logger.warning(FAIL_POLICY_WARNING)

    def _is_consumer(self):
        return self._kv_role in ("kv_consumer", "kv_both")

    def _is_producer(self):
        return self._kv_role in ("kv_producer", "kv_both")

    def block_key(self, block_hash, layer=0, tp_rank=None, pp_rank=None, tenant=None):
        """The store key of one block of one layer on one rank (default: this process's,
        rank 0 unless kv_connector_extra_config names one) for a tenant (tenant_of; None:
        requests with no cache_salt and no LoRA); None while that rank's layout is
        unknown."""
        tp = self._keys.tp_rank if tp_rank is None else tp_rank
        pp = self._keys.pp_rank if pp_rank is None else pp_rank
        layout = self._layouts.lookup(self._db, tp, pp)
        if layout is None:
            return None
        return self._keys.layer_key(self._keys.rank_prefix(layout[0], tp, pp, tenant), layer,
                                    block_hash)

    def _state(self, request):
        state = self._requests.get(request.request_id)
        if state is None:
            state = self._requests[request.request_id] = _RequestState(
                request=request, tenant=tenant_of(request))
        state.request = request
        return state

    # ---------------------------------------------------------------- lookups
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple:
        state = self._state(request)
        state.local_computed_tokens = num_computed_tokens
        if not self._is_consumer():
            return 0, False
        hashes = _request_hashes(request)
        bs = self._keys.block_size
        start = num_computed_tokens // bs
        if start >= len(hashes):
            return 0, False
        accounted = self._account is not None and self._account.wants(request.request_id)
        located = [] if accounted or self._planner is not None else None
        num_tokens = int(attr_of(request, "num_tokens",
                                 len(attr_of(request, "prompt_token_ids", []))))
        found = self._present_prefix(hashes[start:], state.tenant, located, start, num_tokens)
        if found is None:
            logger.debug("kvengine: no layout published yet for engine %s",
                         self._keys.engine_id)
            return 0, False
        hit, plan = found, None
        state.tier_shares, state.rewrite = None, frozenset()  # this lookup's, not a former one's
        if found and self._planner is not None:
            plan = self._planner.plan(located[:found], num_tokens - start * bs)
            if plan is not None:
                hit = plan.load_blocks
                state.tier_shares = plan.tier_shares
                if hit < found:
                    self._record(planned_recompute_tokens=(found - hit) * bs)
                    state.rewrite = frozenset(hashes[start + hit:start + found])
        hit = self._usable_at_most(hit)
        if hit and self._prefetch:
            started = self._start_prefetch(self._hit_keys[:hit * self._hit_per_block])
            if self._planner is not None:
                self._planner.prefetching(started)
        if hit and (start + hit) * bs >= num_tokens and not self._skips.uniform():
            # vLLM recomputes the last token; a hit short of it ends where every group's
            # block does (a multiple of the groups' LCM), so it is a whole run shorter.
            hit = self._usable_at_most((num_tokens - 1) // bs - start)
        matched = (start + hit) * bs
        if matched >= num_tokens:
            matched = num_tokens - 1  # recompute the last token so vLLM gets its logits
        new_tokens = max(0, matched - num_computed_tokens)
        self._record(lookup_tokens=max(0, num_tokens - num_computed_tokens),
                     hit_tokens=new_tokens)
        if accounted:
            state.account = self._account.lookup(
                request.request_id, hashes[start:], start, bs, [k for k, _ in located],
                [r for _, r in located], hit, max(0, num_tokens - num_computed_tokens),
                new_tokens, found=found, plan=plan)
        return new_tokens, False

    def _present_prefix(self, hashes, tenant, located=None, first=0, num_tokens=None):
        """How many of the tenant's blocks, from the first, have every layer on every rank
        in the store -- but a layer a position may lack, its group holding vLLM's null block
        there for this request (_null_aware_prefix); None while a rank's layout is
        unpublished.  hashes are the request's from block `first`, of num_tokens tokens.
        With `located` (a list), asks where each key is (BatchLocate) and appends (keys,
        results) per block to it.  Keeps the keys (self._hit_keys, self._hit_per_block) for
        the prefetch."""
        ranks = self._keys.ranks()
        layouts = [self._layouts.lookup(self._db, t, p) for t, p in ranks]
        if any(la is None for la in layouts):
            return None
        prefixes = [(self._keys.rank_prefix(tag, t, p, tenant), n)
                    for (t, p), (tag, n) in zip(ranks, layouts)]
        per_block = sum(n for _, n in prefixes)
        keys = [self._keys.layer_key(prefix, layer, h) for h in hashes
                for prefix, n in prefixes for layer in range(n)]
        if located is None:
            present = self._db.batch_is_exist(keys)
        else:
            present = self._db.batch_locate(keys)
            if present and all(r == NOT_SUPPORTED for r in present):  # an older owner
                present = self._db.batch_is_exist(keys)
            located.extend((keys[b * per_block:(b + 1) * per_block],
                            present[b * per_block:(b + 1) * per_block])
                           for b in range(len(hashes)))
            present = [1 if r > 0 else r for r in present]
        self._hit_keys, self._hit_per_block = keys, per_block
        self._usable = None
        if self._skips.needs_groups() and num_tokens is not None:
            hit = self._null_aware_prefix(present, ranks, layouts, len(hashes), first,
                                          num_tokens)
            if hit is not None:
                return hit
        hit = 0
        for b in range(len(hashes)):
            if all(r == 1 for r in present[b * per_block:(b + 1) * per_block]):
                hit += 1
            else:
                break
        return hit

    def _null_aware_prefix(self, present, ranks, layouts, count, first, num_tokens):
        """The longest run of the `count` positions from `first` whose keys a request of
        num_tokens tokens needs are all present: a layer's key may be absent where its
        group holds vLLM's null block once the run is loaded (nullblocks.py).  Keeps each
        run length's answer (self._usable) for _usable_at_most.  None while a rank has
        not published its layers' groups (then every key is needed)."""
        key_groups = []
        for (t, p), (_, n) in zip(ranks, layouts):
            groups = self._layouts.groups(self._db, t, p)
            if groups is None or len(groups) != n:
                return None
            key_groups += groups
        per_block = len(key_groups)
        missing = [{g for g, r in zip(key_groups, present[b * per_block:(b + 1) * per_block])
                    if r != 1} for b in range(count)]
        bs = self._keys.block_size
        self._usable = self._skips.usable(
            first, missing, lambda h: min((first + h) * bs, num_tokens - 1))
        return self._usable_at_most(count)

    def _usable_at_most(self, hit):
        """The longest usable run of at most `hit` positions of the last lookup: a run the
        planner cut may end where a sliding window needs a position saved as null."""
        if self._usable is None:
            return hit
        while hit > 0 and not self._usable[hit]:
            hit -= 1
        return hit

    def _start_prefetch(self, keys):
        """The worker loads these keys soon: the store starts reading those on SSD into
        memory now.  A hint only: a failure changes nothing but the load's speed.  Returns
        how many keys it started reading up."""
        try:
            results = self._db.batch_prefetch(keys)
        except Exception as e:  # an older module without it, or a store gone away
            logger.debug("kvengine: prefetch not started: %s", e)
            return 0
        errors = [r for r in results if r < 0]
        if errors:
            logger.debug("kvengine: prefetch refused %d of %d keys (first error %d)",
                         len(errors), len(keys), errors[0])
        return sum(1 for r in results if r == 1)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        state = self._state(request)
        block_ids = block_id_groups(blocks.get_block_ids()) if blocks is not None else []
        if block_ids and any(block_ids):
            state.block_ids = block_ids
        if num_external_tokens <= 0 or not self._is_consumer():
            return
        bs = self._keys.block_size
        first = state.local_computed_tokens // bs
        last = -(-(state.local_computed_tokens + num_external_tokens) // bs)  # ceil
        hashes = _request_hashes(request)
        last = min([last, len(hashes)] + self._positions(state.block_ids))
        state.pending_load = BlockTransfer(request.request_id,
                                           self._skips.at_positions(state.block_ids, first,
                                                                    last - first),
                                           hashes[first:last], first_block=first,
                                           tenant=state.tenant, tier_shares=state.tier_shares)
        # Blocks loaded from the store need no save.
        state.saved_blocks = max(state.saved_blocks, last)

    # ---------------------------------------------------------------- the step's metadata
    def build_connector_meta(self, scheduler_output: Any) -> KVEngineConnectorMetadata:
        meta = KVEngineConnectorMetadata()
        if self._planner is not None:
            meta.step_tokens = self._planner.step_tokens(scheduler_output)
        if self._feed is not None:
            meta.removals_through = self._feed.last_sequence()
        num_scheduled = attr_of(scheduler_output, "num_scheduled_tokens", {}) or {}
        for new_req in attr_of(scheduler_output, "scheduled_new_reqs", []) or []:
            state = self._requests.get(new_req.req_id)
            if state is None:
                continue  # never shown to this connector (no block hashes to work with)
            state.block_ids = block_id_groups(new_req.block_ids)
            if state.account is not None:
                meta.accounts[new_req.req_id] = state.account
                state.account = None
            self._take_load(meta, state)
            tokens = new_req.num_computed_tokens + num_scheduled.get(new_req.req_id, 0)
            self._add_save(meta, state, new_req.req_id, tokens)
        cached = attr_of(scheduler_output, "scheduled_cached_reqs")
        if cached is not None:
            self._add_cached(meta, cached, num_scheduled)
        for req_id in attr_of(scheduler_output, "preempted_req_ids", None) or ():
            meta.preempted_req_ids.append(req_id)
            state = self._requests.get(req_id)
            if state is not None:
                state.pending_load = None
                # Its blocks are freed: the ones not yet saved will be recomputed (and
                # saved then) after it resumes.
                state.block_ids = []
        for req_id in attr_of(scheduler_output, "finished_req_ids", None) or ():
            meta.finished_req_ids.append(req_id)
            self._requests.pop(req_id, None)
        return meta

    def _add_cached(self, meta, cached, num_scheduled):
        """The running and resumed requests of the step: their new block ids, their loads
        (a resumed request's, to its new blocks) and their newly full blocks."""
        resumed_ids = set(attr_of(cached, "resumed_req_ids", None) or ())
        resumed_flags = attr_of(cached, "resumed_from_preemption", None)  # older vLLM
        for i, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            resumed = req_id in resumed_ids or bool(resumed_flags and resumed_flags[i])
            new_ids = cached.new_block_ids[i]
            if resumed:
                state.block_ids = block_id_groups(new_ids)
            elif new_ids is not None:
                new_groups = block_id_groups(new_ids)
                if not state.block_ids:
                    state.block_ids = [[] for _ in new_groups]
                for g, ids in enumerate(new_groups):
                    _extend_moving(state.block_ids[g], ids)
            self._drop_skipped(state, cached.num_computed_tokens[i])
            self._take_load(meta, state)
            tokens = cached.num_computed_tokens[i] + num_scheduled.get(req_id, 0)
            self._add_save(meta, state, req_id, tokens)

    def _drop_skipped(self, state, num_computed_tokens):
        """vLLM's remove_skipped_blocks, which ran as this step was scheduled: the blocks
        a running request left behind in its skipping groups are freed, possibly another
        request's now, and it holds the null block there -- its cached-request data does
        not say so.  A save still to come of such a position (held back by
        num_publishable_block_hashes) must not read the freed block (nullblocks.py)."""
        for g, ids in enumerate(state.block_ids):
            if self._skips.has_nulls(g):
                n = min(len(ids), self._skips.skipped_blocks(g, num_computed_tokens))
                # As vLLM's loop: the positions before a null one are null already.
                for i in range(n - 1, -1, -1):
                    if ids[i] == NULL_BLOCK_ID:
                        break
                    ids[i] = NULL_BLOCK_ID

    def _positions(self, block_ids):
        """Per group, the positions its blocks cover (a group's block may span several)."""
        return [self._skips.positions(g, len(ids)) for g, ids in enumerate(block_ids)]

    def _take_load(self, meta, state):
        if state.pending_load is not None:
            load = state.pending_load
            # The block ids may have been (re)allocated after update_state_after_alloc.
            n = len(load.block_hashes)
            first = state.local_computed_tokens // self._keys.block_size
            if state.block_ids and all(p >= first + n
                                       for p in self._positions(state.block_ids)):
                load.block_ids = self._skips.at_positions(state.block_ids, first, n)
            meta.loads.append(load)
            state.pending_load = None

    def _add_save(self, meta, state, req_id, num_tokens):
        if not self._is_producer():
            return
        hashes = _request_hashes(state.request)
        full = min([num_tokens // self._keys.block_size, len(hashes)]
                   + self._positions(state.block_ids))
        full = _publishable(state.request, full)
        if full > state.saved_blocks:
            first = state.saved_blocks
            save = BlockTransfer(req_id,
                                 self._skips.at_positions(state.block_ids, first, full - first),
                                 hashes[first:full], first_block=first, tenant=state.tenant)
            rewrite = [h for h in hashes[first:full] if h in state.rewrite]
            if rewrite:
                save.rewrite_hashes = rewrite
            if self._events:
                bs = self._keys.block_size
                tokens = list(attr_of(state.request, "all_token_ids", None)
                              or attr_of(state.request, "prompt_token_ids", []))
                save.parent_hash = hashes[first - 1] if first > 0 else None
                save.token_ids = [tokens[b * bs:(b + 1) * bs] for b in range(first, full)]
                lora = attr_of(state.request, "lora_request")
                if lora is not None:
                    save.lora = (attr_of(lora, "lora_int_id"), attr_of(lora, "lora_name"))
            meta.saves.append(save)
            state.saved_blocks = full

    # ---------------------------------------------------------------- requests and the cache
    def update_connector_output(self, connector_output: Any):
        """The workers' loads of the last step, measured: the planner's estimates follow
        them (their stats carry one sample per load job, planner.py)."""
        if self._planner is not None:
            self._planner.record(attr_of(connector_output, "kv_connector_stats"))

    def request_finished(self, request: Any) -> tuple:
        # Saves finish within the step (wait_for_save), so vLLM may free the blocks now.
        self._requests.pop(request.request_id, None)
        return False, None

    def reset_cache(self) -> bool:
        """vLLM's reset_prefix_cache: forget this model's blocks in the store (every rank
        and layout of this model and dtype; other models, and the layout records the
        workers published, are untouched)."""
        removed = self._db.remove_by_regex(self._keys.model_blocks_pattern())
        if removed < 0:
            logger.warning("kvengine: reset_cache failed (%s)", kvengine.error_name(removed))
            return False
        return True
