"""What the connector's scheduler side and worker side share: the metadata one sends the
other each step, and how both spell a block's keys (docs/vllm.md, "Keys and values").

    <model>@<dtype>@<layout tag>@bs<block_size>@tp<r>of<n>@pp<r>of<n>@m<fingerprint>[@t<tenant>]/L<layer>/<block hash>

The layout tag is known only to the workers (it comes from the registered tensors); each
worker publishes it under its engine's id (LayoutRecords) and the scheduler side reads it
back before its first lookup, so both sides build the same keys.  The fingerprint
(model_fingerprint) is a hash of what makes a block's bytes reusable besides what the key
spells out; the tenant (tenant_of) a hash of the request's cache_salt and LoRA name.
"""

import dataclasses
import hashlib
import json
import logging
from typing import Optional

from .. import regex_escape
from ..fingerprint import check_fingerprint as _check_fingerprint
from ..fingerprint import config_fields, fingerprint_of
from ._vllm_compat import HAVE_VLLM, KVConnectorMetadata, KVConnectorRole

logger = logging.getLogger("kvengine.vllm")


def attr_of(obj, name, default=None):
    """obj.name, or default when obj is None or lacks it (vLLM's objects gain and lose
    members between versions)."""
    return getattr(obj, name, default) if obj is not None else default


def block_id_groups(block_ids):
    """vLLM passes block ids per KV-cache group, tuple[list[int], ...] (older vLLM: one
    flat list); returned as a list of lists."""
    if block_ids is None:
        return []
    if len(block_ids) > 0 and isinstance(block_ids[0], (list, tuple)):
        return [list(g) for g in block_ids]
    return [list(block_ids)]


# ------------------------------------------------------------------ metadata


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save: position i of the request's run holds
    block block_ids[g][i] in KV-cache group g and is hashed block_hashes[i] (hex)."""

    req_id: str
    block_ids: list  # one list per KV-cache group
    block_hashes: list
    # For KV events (saves, when vLLM publishes them): the hash (hex) of the block before
    # the first, and each block's token ids.
    parent_hash: Optional[str] = None
    token_ids: Optional[list] = None
    first_block: int = 0  # the request's block at position 0 of this run
    # The request's tenant (tenant_of): its blocks' keys carry it; None for none.
    tenant: Optional[str] = None
    # For KV events (saves): the request's LoRA adapter (lora_int_id, lora_name), as
    # vLLM's BlockStored carries it; None without one.
    lora: Optional[tuple] = None
    # For loads: the blocks' bytes by tier (memory, ssd, peer) as the lookup found them,
    # shares of 1, so that the worker's measured load teaches the planner (planner.py);
    # None when nothing was planned.
    tier_shares: Optional[tuple] = None
    # For saves: blocks (hashes, hex) to save even though the store has them -- hits the
    # load planner left to recompute, saved again from the recomputed KV so that they
    # come back into memory without an SSD read, as a load would have promoted them.
    rewrite_hashes: Optional[list] = None


@dataclasses.dataclass
class KVEngineConnectorMetadata(KVConnectorMetadata):
    """What the scheduler-side connector tells the workers for one step (picklable)."""

    loads: list = dataclasses.field(default_factory=list)  # list[BlockTransfer]
    saves: list = dataclasses.field(default_factory=list)  # list[BlockTransfer]
    preempted_req_ids: list = dataclasses.field(default_factory=list)
    finished_req_ids: list = dataclasses.field(default_factory=list)
    # The removal feed's newest sequence when the step was scheduled: every rank reads
    # the feed up to it, so that the ranks report the same removals (events.py).
    removals_through: Optional[int] = None
    # The lookup's part of the account of each sampled request scheduled this step
    # (account.py), by request id.
    accounts: dict = dataclasses.field(default_factory=dict)
    # The tokens this step computes, for the load planner's prefill rate (planner.py,
    # StepTimer): the worker times the step when it is not 0.
    step_tokens: int = 0


# ------------------------------------------------------------------ keys

def model_fingerprint(vllm_config, dtype, block_size, tp_size, pp_size) -> tuple:
    """(fingerprint, description) of what makes this instance's bytes reusable: the
    model (name as vLLM loads it, and revision), KV dtype, block size, TP/PP, whether it
    uses MLA, its quantisation, and the config fields of fingerprint.HF_KV_FIELDS."""
    model_config = attr_of(vllm_config, "model_config")
    hf = attr_of(model_config, "hf_text_config")
    if hf is None:
        hf = attr_of(model_config, "hf_config")
    parts = {
        "model": attr_of(model_config, "model"),
        "revision": attr_of(model_config, "revision"),
        "dtype": dtype,
        "block_size": block_size,
        "tp": tp_size,
        "pp": pp_size,
        "quantization": attr_of(model_config, "quantization"),
        "config": config_fields(hf) if hf is not None else {},
    }
    try:
        parts["use_mla"] = bool(attr_of(model_config, "use_mla", False))
    except Exception:  # noqa: BLE001 -- a property that needs vLLM's platform state
        pass
    return fingerprint_of(parts), parts


def tenant_of(request) -> Optional[str]:
    """The tenant a request's blocks belong to: 16 hex digits of a hash of its cache_salt
    and LoRA adapter name (vLLM folds both into its block hashes, and so into a prefix
    only tenants with the same pair share); None when it has neither.  Hashed, so the salt
    -- a secret, in vLLM's threat model -- never appears in a key, a log or kv_ldb."""
    salt = attr_of(request, "cache_salt")
    lora = attr_of(attr_of(request, "lora_request"), "lora_name")
    if salt is None and lora is None:
        return None
    text = json.dumps(["kvengine-tenant", salt, lora])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class KeyScheme:
    """The parts of every key of one vLLM instance, from its config: model and dtype,
    block size, parallel shape, the instance's engine id, and this process's rank."""

    def __init__(self, vllm_config, kv_transfer_config, extra, role, kv_cache_config=None):
        model_config = attr_of(vllm_config, "model_config")
        cache_config = attr_of(vllm_config, "cache_config")
        parallel_config = attr_of(vllm_config, "parallel_config")
        # The tokens of a position: of one block hash of a request, which is the cache's
        # block size unless the KV-cache groups' block sizes differ (nullblocks.py).
        from .nullblocks import hash_block_size

        self.block_size = hash_block_size(cache_config, kv_cache_config)
        model = extra.get("model_name") or attr_of(model_config, "model", "model")
        dtype = attr_of(cache_config, "cache_dtype", "auto")
        if dtype in (None, "auto"):
            dtype = str(attr_of(model_config, "dtype", "auto")).replace("torch.", "")
        self.tp_size = int(attr_of(parallel_config, "tensor_parallel_size", 1))
        self.pp_size = int(attr_of(parallel_config, "pipeline_parallel_size", 1))
        self.key_model = "%s@%s" % (str(model).replace("/", "--"), dtype)
        self.fingerprint, self.fingerprint_parts = model_fingerprint(
            vllm_config, dtype, self.block_size, self.tp_size, self.pp_size)
        # The instance's id, shared by its scheduler and its workers (vLLM: a uuid per
        # instance unless set); it names the layout record the workers publish.
        self.engine_id = str(extra.get("engine_id")
                             or attr_of(kv_transfer_config, "engine_id", None) or "default")
        self.tp_rank, self.pp_rank = _this_rank(extra, role)

    def ranks(self):
        """Every (tp, pp) rank of the instance: the ranks a block must be stored on."""
        return [(t, p) for p in range(self.pp_size) for t in range(self.tp_size)]

    def rank_prefix(self, tag, tp, pp, tenant=None):
        prefix = "%s@%s@bs%d@tp%dof%d@pp%dof%d@m%s" % (
            self.key_model, tag, self.block_size, tp, self.tp_size, pp, self.pp_size,
            self.fingerprint)
        return prefix if tenant is None else "%s@t%s" % (prefix, tenant)

    def layer_key(self, prefix, layer, block_hash):
        """The key of one block of one layer, under a rank_prefix."""
        return "%s/L%d/%s" % (prefix, layer, block_hash)

    def layout_record_key(self, tp, pp):
        return "%s@bs%d@tp%dof%d@pp%dof%d@m%s/engine-layout/%s" % (
            self.key_model, self.block_size, tp, self.tp_size, pp, self.pp_size,
            self.fingerprint, self.engine_id)

    def layer_groups_record_key(self, tp, pp):
        """The record of each layer's KV-cache group on a rank (LayoutRecords.groups): a
        key of its own, so that readers of the layout record before it are unchanged."""
        return self.layout_record_key(tp, pp) + "/groups"

    def fingerprint_record_key(self):
        """The record of the fingerprint last seen for this model name, dtype, block size
        and parallel shape (instances that differ in those may share a store at once)."""
        return "%s@bs%d@tp%d@pp%d/fingerprint" % (self.key_model, self.block_size,
                                                   self.tp_size, self.pp_size)

    def model_blocks_pattern(self):
        """A regex matching, whole, every block key of this model and dtype (every rank,
        layout, fingerprint and tenant), and no record."""
        return regex_escape(self.key_model) + "@[^/]*/L[0-9]+/.*"

    def block_key_pattern(self):
        """A regex matching, whole, a block key of this instance (any rank, layout and
        tenant; this fingerprint), its block hash as group 1."""
        return (regex_escape(self.key_model)
                + r"@[^/]*@bs%d@tp\d+of%d@pp\d+of%d@m%s(?:@t[0-9a-f]+)?/L\d+/([0-9a-f]+)$"
                % (self.block_size, self.tp_size, self.pp_size, self.fingerprint))


def _this_rank(extra, role):
    """(tp, pp) of this process: kv_connector_extra_config's, else a worker's from vLLM's
    parallel groups, else 0."""
    tp = extra.get("tp_rank")
    pp = extra.get("pp_rank")
    if (tp is None or pp is None) and HAVE_VLLM and role == KVConnectorRole.WORKER:
        try:  # pragma: no cover - needs vLLM's distributed state
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group

            tp = get_tp_group().rank_in_group if tp is None else tp
            pp = get_pp_group().rank_in_group if pp is None else pp
        except Exception:  # noqa: BLE001 -- not initialized: single rank
            pass
    return int(tp or 0), int(pp or 0)


def check_fingerprint(db, keys: KeyScheme) -> Optional[str]:
    """Compares this instance's fingerprint with the one recorded in the store for its
    model name and shape, then records its own (fingerprint.check_fingerprint): a change
    -- another model, a new revision or a changed config behind the same name -- is one
    warning naming both; the blocks saved under the old one are misses (the key carries
    the fingerprint), never bytes.  Called once per instance, by its scheduler side."""
    return _check_fingerprint(db, keys.fingerprint_record_key(), keys.key_model,
                              keys.fingerprint, keys.fingerprint_parts, logger)


class LayoutRecords:
    """The layout record of each rank of an instance: its layout tag and number of layers,
    published by that rank's worker when it registers its caches, read back by whoever
    forms that rank's keys without its tensors.  Found records are kept: a rank's layout
    does not change while its instance runs."""

    def __init__(self, keys: KeyScheme):
        self._keys = keys
        self._found = {}  # (tp, pp) -> (layout tag, number of layers)
        self._found_groups = {}  # (tp, pp) -> [KV-cache group of each layer]

    def publish(self, db, tp, pp, tag, num_layers):
        """Stores this rank's record; the store's status code (0: stored)."""
        record = ("%s\n%d" % (tag, num_layers)).encode()
        return db.put(self._keys.layout_record_key(tp, pp), record)

    def lookup(self, db, tp, pp) -> Optional[tuple]:
        """(layout tag, number of layers) of one rank; None until its worker published."""
        found = self._found.get((tp, pp))
        if found is None:
            raw = db.get(self._keys.layout_record_key(tp, pp))
            if not raw:
                return None
            tag, count = bytes(raw).decode().split("\n")
            found = self._found[(tp, pp)] = (tag, int(count))
        return found

    def publish_groups(self, db, tp, pp, groups):
        """Stores the KV-cache group of each of this rank's layers (registration order):
        the scheduler side needs it to know which layers a position may lack where vLLM
        handed a group the null block (nullblocks.py).  The store's status code."""
        return db.put(self._keys.layer_groups_record_key(tp, pp),
                      ",".join(str(g) for g in groups).encode())

    def groups(self, db, tp, pp):
        """[group of layer i] of one rank; None until its worker published them (then every
        layer counts as a group that needs every position)."""
        found = self._found_groups.get((tp, pp))
        if found is None:
            raw = db.get(self._keys.layer_groups_record_key(tp, pp))
            if not raw:
                return None
            found = self._found_groups[(tp, pp)] = [int(g) for g in bytes(raw).decode().split(",")]
        return found
