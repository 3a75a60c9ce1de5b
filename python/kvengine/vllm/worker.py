"""KVEngineWorker: the connector's worker side (one per vLLM worker process, one rank).

One value per (block, layer) is what lets the work follow vLLM's forward pass layer by
layer: start_load_kv hands the step's load to a load thread, which issues every layer's
reads at once (one layer-wise load, Store.batch_get_into_groups: through a cluster, the
reads of all layers are in flight together, so the network's round trip is paid about
once, not once per layer), and wait_for_layer_load(layer i) returns once layer i has
landed, while later layers are still arriving; save_kv_layer(layer i) hands layer i's batch to a save thread while
the next layer is computed, and wait_for_save waits for them.  (A value spanning all
layers would make the first layer wait for the last.)  A block whose load fails is
reported by get_block_ids_with_load_errors; vLLM then fails the request or recomputes the
block, as kv_load_failure_policy says.
"""

import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Any, Optional

import kvengine

from .common import KeyScheme, KVEngineConnectorMetadata, LayoutRecords, attr_of, block_id_groups
from .account import RecentRemovals
from .events import BlockEvents
from .layout import analyse_layer, analyse_state_layer
from .nullblocks import ABSENT, GroupSkips
from .planner import StepTimer, load_sample

logger = logging.getLogger("kvengine.vllm")


def _storage_bytes(tensor):
    if hasattr(tensor, "untyped_storage"):  # torch >= 2.0
        return tensor.untyped_storage().nbytes()
    return tensor.storage().nbytes()


@dataclasses.dataclass
class _Layer:
    name: str
    index: int  # registration order: the L<index> of the key
    group: int  # KV-cache group whose block ids address this layer
    tensor: Any
    flat: Any  # 1-D uint8 view over the tensor's memory (for the staged path)
    base: int  # data_ptr of flat
    offset: int  # bytes from base to block 0
    geometry: Any  # layout.LayerGeometry

    def parts(self, block_id):
        """Addresses and sizes of the block's bytes in this layer."""
        g = self.geometry
        if not 0 <= block_id < g.num_blocks:
            raise ValueError("block id %d out of range (%d blocks)" % (block_id, g.num_blocks))
        start = self.base + self.offset + block_id * g.block_stride
        return [start + s for s in g.segments], g.segment_sizes()

    def views(self, block_id):
        g = self.geometry
        start = self.offset + block_id * g.block_stride
        return [self.flat[start + s:start + s + n]
                for s, n in zip(g.segments, g.segment_sizes())]


class _LoadJob:
    """One step's loads: one layer-wise load on the load thread; an event per layer tells
    wait_for_layer_load when that layer has landed."""

    def __init__(self, num_layers, positions):
        self.events = [threading.Event() for _ in range(num_layers)]
        self.positions = positions  # [(block ids per group, hash hex, tenant)]
        self.errors = set()  # failed positions (indexes into positions)
        self.codes = {}  # failed position -> the store's result (negative code, or bytes)
        self.layer_ms = []  # per layer, ms from the start to the layer's being ready
        self.transfers = []  # the step's loads (BlockTransfer), for the request account
        self.started = time.perf_counter()
        self.future = None


def _positions(transfers):
    """[(block ids per group, hash hex, tenant)] of the transfers, one per block
    position."""
    out = []
    for tr in transfers:
        groups = block_id_groups(tr.block_ids)
        tenant = getattr(tr, "tenant", None)
        for i, h in enumerate(tr.block_hashes):
            out.append(([g[i] for g in groups], h, tenant))
    return out


def _widen_failures(job):
    """A group's block may cover several positions (its block size a multiple of the
    hashes'): it holds ids only at the last of them (ABSENT before).  A failed position
    fails the whole of each such block it lies in -- and so every position that block
    covers, in every group: a block's groups are loaded together or not at all."""
    before = -1
    while before != len(job.errors):  # a widened block may lie in another group's
        before, i = len(job.errors), 0
        for tr in job.transfers:
            n = len(tr.block_hashes)
            for g in range(len(job.positions[i][0]) if n else 0):
                run = []
                for k in range(i, i + n):
                    run.append(k)
                    if job.positions[k][0][g] != ABSENT or k == i + n - 1:
                        if len(run) > 1 and any(r in job.errors for r in run):
                            job.errors.update(run)
                        run = []
            i += n


def _in_range(layer, ids):
    """Whether the layer's block id among ids (per group) is one of its blocks, or
    ABSENT (its group has no block ending at the position: nothing to move)."""
    return layer.group < len(ids) and (ids[layer.group] == ABSENT or
                                       0 <= ids[layer.group] < layer.geometry.num_blocks)


def _warn_outside(layer, block_ids, what):
    logger.warning("kvengine: block %s not %s: outside layer %s's cache (%d blocks, "
                   "KV-cache group %d)", ", ".join(str(ids) for ids in block_ids), what,
                   layer.name, layer.geometry.num_blocks, layer.group)


def _cuda_work_done():
    """An event recorded on the current CUDA stream: done once the work queued so far
    (the attention that wrote the blocks) is."""
    import torch

    event = torch.cuda.Event()
    event.record()
    return event


class KVEngineWorker:
    """What the worker-side KVEngineConnector does: reads the caches' layout, loads and
    saves each step's blocks layer by layer on a load thread and a save thread, and
    reports the blocks whose load failed.

    vLLM's model runner calls it from one thread; the load and save threads touch only
    the job handed to them, the store, the caches and record (the connector's interval
    stats).  The metadata of the step is passed in (None when none is bound)."""

    def __init__(self, kv_cache_config: Any, extra: dict, keys: KeyScheme, db, record,
                 events=False, accounts=None):
        self._kv_cache_config = kv_cache_config
        # The request account (account.py): RequestAccounts and the store's recent
        # removals, on the rank that writes it; None elsewhere or when it is off.
        self._accounts = accounts
        self._removals = RecentRemovals(db, keys) if accounts is not None else None
        # KV events (events.py): the blocks this rank saved, and the feed's removals.
        self._block_events = BlockEvents(db, keys) if events else None
        self._kv_cache_shape = extra.get("kv_cache_shape")
        self._keys = keys
        self._db = db
        self._record = record
        self._layouts = LayoutRecords(keys)
        # vLLM's null block (block 0) in the groups that skip positions: never saved under
        # a request's key, never loaded into (nullblocks.py).
        self._skips = GroupSkips(kv_cache_config, keys.block_size)
        self._layers = []  # list[_Layer], registration order
        self._by_name = {}
        self._layout_tag = None
        # Staged: blocks go through a host tensor (pinned where CUDA is) instead of their
        # own addresses.  Only for caches the engine cannot reach: CUDA caches go to the
        # engine as they are in a CUDA build (its GPU staging path, docs/gpu.md).
        self._staged = bool(extra.get("force_staging", False))
        self._on_cuda = False  # the caches are CUDA memory: saves wait for the compute
        self._load_executor = None
        self._save_executor = None
        self._load_job = None
        self._save_plan = None  # this step's [(block ids per group, hash hex, tenant)] to save
        self._save_rewrite = set()  # ... hashes saved even where the store has them
        self._save_futures = {}  # layer index -> Future
        self._save_started = None
        self._load_errors = set()
        self.num_loaded_blocks = 0
        self.num_saved_blocks = 0
        self.num_skipped_saves = 0
        # The forward steps timed for the load planner's prefill rate (planner.py): by
        # one rank, and only without pipeline stages (a stage's time is not the step's).
        self._step_timer = (StepTimer(record) if (keys.tp_rank, keys.pp_rank) == (0, 0)
                            and keys.pp_size == 1 else None)

    # ---------------------------------------------------------------- keys and caches
    def block_key(self, block_hash, layer=0, tp_rank=None, pp_rank=None, tenant=None):
        """The store key of one block of one layer on one rank (default: this worker's)
        for a tenant (common.tenant_of); None while that rank's layout is unknown."""
        tp = self._keys.tp_rank if tp_rank is None else tp_rank
        pp = self._keys.pp_rank if pp_rank is None else pp_rank
        if (tp, pp) == (self._keys.tp_rank, self._keys.pp_rank) and self._layout_tag is not None:
            layout = self._layout_tag, len(self._layers)
        else:
            layout = self._layouts.lookup(self._db, tp, pp)
        if layout is None:
            return None
        return self._keys.layer_key(self._keys.rank_prefix(layout[0], tp, pp, tenant), layer,
                                    block_hash)

    def _layer_key(self, layer, block_hash, tenant=None):
        prefix = self._keys.rank_prefix(self._layout_tag, self._keys.tp_rank, self._keys.pp_rank,
                                        tenant)
        return self._keys.layer_key(prefix, layer.index, block_hash)

    def register_kv_caches(self, kv_caches: dict) -> None:
        self._layers = self._read_layers(kv_caches)
        self._by_name = {layer.name: layer for layer in self._layers}
        tags = []
        for layer in self._layers:
            if layer.geometry.tag not in tags:
                tags.append(layer.geometry.tag)
        self._layout_tag = "+".join(tags)
        self._publish_layout()
        if self._load_executor is None:
            self._load_executor = concurrent.futures.ThreadPoolExecutor(1, "kvengine-load")
            self._save_executor = concurrent.futures.ThreadPoolExecutor(1, "kvengine-save")
        logger.info("kvengine: %d layers, layout %s, %d bytes per block and layer",
                    len(self._layers), self._layout_tag,
                    self._layers[0].geometry.block_bytes if self._layers else 0)

    def _read_layers(self, kv_caches):
        """Each cache's block geometry (layout.py) and KV-cache group, in registration
        order; notes whether the caches are on CUDA and whether they need staging."""
        import torch

        group_of = {}
        for g, group in enumerate(attr_of(self._kv_cache_config, "kv_cache_groups", None)
                                  or []):
            for name in attr_of(group, "layer_names", None) or []:
                group_of[name] = g
        num_blocks = attr_of(self._kv_cache_config, "num_blocks", None)
        layers = []
        for index, (name, t) in enumerate(kv_caches.items()):
            if isinstance(t, (list, tuple)) and all(isinstance(x, torch.Tensor) for x in t):
                # A Mamba layer: its state tensors, one block's states side by side.
                geometry = analyse_state_layer(name, t)
                t = min(t, key=lambda x: x.data_ptr())  # the first bytes of a block
            elif not isinstance(t, torch.Tensor):
                raise TypeError("kv cache of layer %s is not a tensor" % name)
            else:
                # A group's block may be several positions (its own block size).
                geometry = analyse_layer(name, t,
                                         self._skips.block_size_of(group_of.get(name, 0)),
                                         num_blocks, self._kv_cache_shape)
            elt = t.element_size()
            flat = torch.as_strided(t, (_storage_bytes(t) // elt,), (1,), 0).view(torch.uint8)
            base = flat.data_ptr()
            layers.append(_Layer(name, index, group_of.get(name, 0), t, flat, base,
                                 t.data_ptr() - base, geometry))
            if t.device.type == "cuda":
                self._on_cuda = True
            if t.device.type != "cpu" and not (t.device.type == "cuda" and kvengine.CUDA_BUILD):
                self._staged = True
        return layers

    def _publish_layout(self):
        """Tells this instance's scheduler-side connector (possibly another process) how
        this rank's keys are formed."""
        rc = self._layouts.publish(self._db, self._keys.tp_rank, self._keys.pp_rank,
                                   self._layout_tag, len(self._layers))
        if rc == 0 and self._skips.needs_groups():
            rc = self._layouts.publish_groups(self._db, self._keys.tp_rank, self._keys.pp_rank,
                                              [layer.group for layer in self._layers])
        if rc != 0:
            raise RuntimeError("kvengine: cannot publish the cache layout (%s)"
                               % kvengine.error_name(rc))

    # ---------------------------------------------------------------- loads
    def start_load_kv(self, meta: Optional[KVEngineConnectorMetadata]) -> None:
        self._finish_load()
        if self._step_timer is not None:
            self._step_timer.start(meta, self._on_cuda)
        if self._accounts is not None and meta is not None:
            for account in getattr(meta, "accounts", {}).values():
                self._accounts.begin(dict(account, missed=list(account.get("missed", []))))
            self._accounts.finish(getattr(meta, "finished_req_ids", None) or ())
        if meta is None or not getattr(meta, "loads", None) or not self._layers:
            return
        job = _LoadJob(len(self._layers), _positions(meta.loads))
        job.transfers = list(meta.loads)
        job.future = self._load_executor.submit(self._run_load, job)
        self._load_job = job

    def _run_load(self, job):
        """The load thread: one layer-wise load of the step's blocks, every layer's reads
        issued when it starts (Store.batch_get_into_groups; through a cluster they are in
        flight together over the peers' connections), each layer's event set as soon as that
        layer is in, in layer order.  The store releases the GIL while it reads, so the
        forward pass runs meanwhile."""
        loaded = [0]
        try:
            # A block with an id out of range in any layer is a failed block: left out of
            # every layer's load (vLLM's own block ids always fit: said once per block).
            for layer in self._layers:
                outside = [i for i, (ids, _, _) in enumerate(job.positions)
                           if i not in job.errors and not _in_range(layer, ids)]
                if outside:
                    _warn_outside(layer, [job.positions[i][0] for i in outside], "loaded")
                job.errors.update(outside)
            todo = [i for i in range(len(job.positions)) if i not in job.errors]
            keys, items, sizes, ends, staging = [], [], [], [], []
            # Per layer, its positions: todo less those its group holds as the null block.
            layer_todo = [self._not_null(layer, todo, job.positions) for layer in self._layers]
            for layer, mine in zip(self._layers, layer_todo):
                keys += [self._layer_key(layer, job.positions[i][1], job.positions[i][2])
                         for i in mine]
                if self._staged:
                    import torch

                    rows = torch.empty((len(mine), layer.geometry.block_bytes), dtype=torch.uint8,
                                       pin_memory=self._on_cuda)
                    staging.append(rows)
                    items += [[row] for row in rows]
                else:
                    for i in mine:
                        ptrs, lens = layer.parts(job.positions[i][0][layer.group])
                        items.append(ptrs)
                        sizes.append(lens)
                ends.append(len(keys))

            def on_ready(index, results):
                layer = self._layers[index]
                first = ends[index] - len(layer_todo[index])
                loaded[0] += self._landed(layer, job, layer_todo[index], keys[first:ends[index]],
                                          results, staging[index] if self._staged else None)
                job.layer_ms.append((time.perf_counter() - job.started) * 1000.0)
                job.events[index].set()

            results = self._db.batch_get_into_groups(keys, items,
                                                     None if self._staged else sizes, ends,
                                                     on_ready)
            if len(job.layer_ms) < len(self._layers):
                # The load was refused as a whole (a closed store): every block failed.
                row = 0
                for mine in layer_todo:
                    for i in mine:
                        job.errors.add(i)
                        job.codes.setdefault(i, (results[row], keys[row]))
                        row += 1
        finally:
            for event in job.events:  # never leave a waiter behind, even on an error
                event.set()
            seconds = time.perf_counter() - job.started
            self._record(load_seconds=seconds,
                         loaded_bytes=loaded[0],
                         loaded_blocks=len(job.positions) - len(job.errors),
                         load_errors=len(job.errors))
            sample = self._load_sample(job, seconds)
            if sample is not None:
                self._record(load_samples=sample)
        return job

    def _not_null(self, layer, todo, positions):
        """The positions of todo whose block in the layer's group is not vLLM's null
        block: the others are skipped by this request in that group (nothing to load, and
        block 0 is everyone's)."""
        return [i for i in todo if not self._null_in(layer, positions[i][0])]

    def _null_in(self, layer, ids):
        """Whether the layer's group holds vLLM's null block in ids (block ids per group),
        or no block of its own (ABSENT: a block of several positions ends elsewhere)."""
        return layer.group < len(ids) and (ids[layer.group] == ABSENT or
                                           self._skips.is_null(layer.group, ids[layer.group]))

    def _load_sample(self, job, seconds):
        """The job's measured load, by tier, for the scheduler side's planner."""
        loaded, i = [], 0
        for tr in job.transfers:
            n = len(tr.block_hashes)
            loaded.append(sum(1 for k in range(i, i + n) if k not in job.errors))
            i += n
        block_bytes = sum(la.geometry.block_bytes for la in self._layers)
        return load_sample(job.transfers, loaded, block_bytes, seconds)

    def _landed(self, layer, job, todo, keys, results, staging):
        """One layer's results: failed blocks noted, staged bytes copied to the cache.
        Returns the bytes loaded."""
        want = layer.geometry.block_bytes
        done = 0
        for row, (i, r) in enumerate(zip(todo, results)):
            if r != want:
                # The block may hold partial bytes: reported, so vLLM fails or recomputes it.
                job.errors.add(i)
                job.codes.setdefault(i, (r, keys[row]))
                logger.warning("kvengine: load of block %s of layer %s failed (%s)",
                               job.positions[i][0], layer.name,
                               kvengine.error_name(r) if r < 0 else "%d bytes" % r)
                continue
            if staging is not None:
                off = 0
                for view in layer.views(job.positions[i][0][layer.group]):
                    view.copy_(staging[row, off:off + view.numel()])
                    off += view.numel()
            done += want
        return done

    def _finish_load(self):
        job, self._load_job = self._load_job, None
        if job is None:
            return
        try:
            job.future.result()
        except Exception:  # noqa: BLE001 -- every block of the step is then suspect
            logger.exception("kvengine: load failed")
            job.errors.update(range(len(job.positions)))
        _widen_failures(job)
        failed = {b for i in job.errors for g, b in enumerate(job.positions[i][0])
                  if b != ABSENT and not self._skips.is_null(g, b)}
        self.num_loaded_blocks += len(job.positions) - len(job.errors)
        self._load_errors |= failed
        if self._accounts is not None:
            self._account_load(job)

    def _account_load(self, job):
        """Each accounted request's part of a finished load job."""
        per_block = sum(la.geometry.block_bytes for la in self._layers)
        self._removals.refresh()
        i = 0
        for tr in job.transfers:
            n = len(tr.block_hashes)
            failures = []
            for k in range(n):
                if i + k in job.errors:
                    code, key = job.codes.get(i + k, (None, None))
                    failures.append((tr.first_block + k, tr.block_hashes[k], code,
                                     self._failure_reason(code, key)))
            loaded = n - len(failures)
            self._accounts.loaded(tr.req_id, loaded, loaded * per_block, job.layer_ms, failures)
            i += n

    def _failure_reason(self, code, key):
        if code is None:
            return {"reason": "unreadable", "error": "block id out of range"}
        if code == -1:  # NotFound: gone since the lookup
            seen = self._removals.why(key)
            if seen is not None:
                return {"reason": "evicted", "at": seen[0], "tier": seen[1], "by": seen[2]}
            return {"reason": "absent"}
        if code < 0:
            return {"reason": "unreadable", "error": kvengine.error_name(code)}
        return {"reason": "unreadable", "error": "%d bytes, not the block's size" % code}

    def wait_for_layer_load(self, layer_name: str) -> None:
        job = self._load_job
        layer = self._by_name.get(layer_name)
        if job is None or layer is None:
            return
        job.events[layer.index].wait()

    def get_block_ids_with_load_errors(self) -> set:
        self._finish_load()
        errors, self._load_errors = self._load_errors, set()
        return errors

    # ---------------------------------------------------------------- saves
    def save_kv_layer(self, layer_name: str, meta: Optional[KVEngineConnectorMetadata]) -> None:
        layer = self._by_name.get(layer_name)
        if layer is None or layer.index in self._save_futures:
            return
        plan = self._step_saves(meta)
        if plan:
            # The layer's attention wrote its blocks on the current CUDA stream: the save
            # thread reads them once that work is done, while the next layer computes.
            written = _cuda_work_done() if self._on_cuda else None
            self._save_futures[layer.index] = self._save_executor.submit(
                self._save_layer, layer, plan, written)

    def _step_saves(self, meta):
        if self._save_plan is None:
            self._save_plan = []
            if meta is not None and self._layers:
                saves = getattr(meta, "saves", None) or []
                self._save_plan = _positions(saves)
                self._save_rewrite = {h for tr in saves
                                      for h in (getattr(tr, "rewrite_hashes", None) or ())}
                self._save_started = time.perf_counter()
        return self._save_plan

    def _save_layer(self, layer, plan, written=None):
        """The save thread: one layer's newly full blocks, skipping those stored already
        (but the hits the planner left to recompute, saved again to bring them back into
        memory).  `written`, a CUDA event, marks the end of the work that wrote them."""
        if written is not None:
            written.synchronize()
        # The null block's bytes are no position's: its keys stay unwritten (nullblocks.py).
        plan = [p for p in plan if not self._null_in(layer, p[0])]
        todo = [(ids[layer.group], h, t) for ids, h, t in plan if _in_range(layer, ids)]
        if len(todo) < len(plan):
            _warn_outside(layer, [ids for ids, _, _ in plan if not _in_range(layer, ids)],
                          "saved")
        keys = [self._layer_key(layer, h, t) for _, h, t in todo]
        present = self._db.batch_is_exist(keys)
        present = [0 if h in self._save_rewrite else p for (_, h, _), p in zip(todo, present)]
        hashes = [h for (_, h, _), p in zip(todo, present) if p != 1]
        todo = [(b, k) for (b, _, _), k, p in zip(todo, keys, present) if p != 1]
        skipped = len(keys) - len(todo)
        if not todo:
            return 0, 0, skipped, set(), set()
        if self._staged:
            import torch

            staging = torch.empty((len(todo), layer.geometry.block_bytes), dtype=torch.uint8,
                                  pin_memory=self._on_cuda)
            for row, (bid, _) in enumerate(todo):
                off = 0
                for view in layer.views(bid):
                    staging[row, off:off + view.numel()].copy_(view)
                    off += view.numel()
            results = self._db.batch_put_from([k for _, k in todo], list(staging))
        else:
            parts = [layer.parts(b) for b, _ in todo]
            results = self._db.batch_put_from_multi_buffers(
                [k for _, k in todo], [p for p, _ in parts], [s for _, s in parts])
        failed = [r for r in results if r != 0]
        if failed:  # a lost save is a future cache miss, never wrong data
            logger.warning("kvengine: %d of %d saves of layer %s failed (%s)", len(failed),
                           len(results), layer.name, kvengine.error_name(failed[0]))
        written = {h for h, r in zip(hashes, results) if r == 0}
        failed_hashes = {h for h, r in zip(hashes, results) if r != 0}
        return len(results) - len(failed), len(failed), skipped, written, failed_hashes

    def wait_for_save(self, meta: Optional[KVEngineConnectorMetadata]) -> None:
        if self._step_timer is not None:
            self._step_timer.stop()  # the forward pass is over (on CUDA: launched)
        self._finish_load()
        plan = self._step_saves(meta)
        try:
            if not plan:
                return
            written = _cuda_work_done() if self._on_cuda else None
            for layer in self._layers:  # layers vLLM did not hand to save_kv_layer
                if layer.index not in self._save_futures:
                    self._save_futures[layer.index] = self._save_executor.submit(
                        self._save_layer, layer, plan, written)
            saved = failed = skipped = 0
            stored, failed_hashes = set(), set()
            for index in sorted(self._save_futures):
                s, f, k, wrote, lost = self._save_futures[index].result()
                saved, failed, skipped = saved + s, failed + f, skipped + k
                stored |= wrote
                failed_hashes |= lost
            if self._block_events is not None:
                self._announce_saves(meta, stored - failed_hashes)
            if self._accounts is not None:
                seconds = time.perf_counter() - self._save_started
                for tr in getattr(meta, "saves", None) or ():
                    done = sum(1 for h in tr.block_hashes if h in stored and h not in failed_hashes)
                    self._accounts.saved(tr.req_id, done, seconds)
            # Block counts are per position; bytes add up over the layers.
            per_block = sum(la.geometry.block_bytes for la in self._layers)
            blocks = saved // max(1, len(self._layers))
            self.num_saved_blocks += blocks
            self.num_skipped_saves += skipped // max(1, len(self._layers))
            self._record(saved_blocks=blocks, saved_bytes=blocks * per_block,
                         skipped_saves=skipped // max(1, len(self._layers)),
                         failed_saves=failed,
                         save_seconds=time.perf_counter() - self._save_started)
        finally:
            self._save_plan = None
            self._save_futures = {}

    def _announce_saves(self, meta, stored):
        """BlockStored for each block of the step's saves in `stored`: written this step
        on a layer at least and failed on none (a block every layer held already was
        announced by whoever saved it)."""
        for tr in getattr(meta, "saves", None) or ():
            for i, h in enumerate(tr.block_hashes):
                if h in stored:
                    parent = tr.parent_hash if i == 0 else tr.block_hashes[i - 1]
                    tokens = tr.token_ids[i] if tr.token_ids else []
                    self._block_events.stored(h, parent, tokens, self._keys.block_size,
                                              getattr(tr, "lora", None))

    def take_kv_events(self, meta) -> list:
        """The events of the step (see events.py); [] when KV events are off."""
        if self._block_events is None:
            return []
        return self._block_events.take(getattr(meta, "removals_through", None))

    def shutdown(self):
        """Waits for the step's load and stops the load and save threads."""
        self._finish_load()
        for executor in (self._load_executor, self._save_executor):
            if executor is not None:
                executor.shutdown(wait=True)
        if self._accounts is not None:
            self._accounts.close()

    def finish_requests(self, req_ids):
        """vLLM's finished requests (get_finished): their accounts are written."""
        if self._accounts is not None:
            self._accounts.finish(req_ids or ())
