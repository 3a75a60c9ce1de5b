"""vLLM's null block in the hybrid KV-cache groups (docs/vllm.md, "Hybrid models").

vLLM's BlockPool reserves block 0 as `null_block`: a placeholder whose contents are
garbage every request shares.  A group whose manager skips tokens -- sliding window,
chunked local attention, Mamba (vllm/v1/core/single_type_kv_cache_manager.py,
get_num_skipped_tokens) -- holds the null block at the positions outside what its layers
still read: remove_skipped_blocks replaces them as the request advances, and
allocate_new_computed_blocks pads a new request's first
get_num_skipped_tokens(computed) // block_size positions with it, its computed tokens
counting the connector's hit.  So a connector is handed block id 0 in those groups:

* a save must not store block 0's bytes under a request's key (a later request would
  load garbage into a real block), and
* a load must not write into block 0 (it would scribble on the block every request
  shares), nor report it as a failed block;

and a position one of whose groups has no saved bytes (the null block at save time) is
usable by a later request only where that request skips the position in that group
too, which is vLLM's own rule applied to the later request's computed tokens.

The groups' block sizes may differ (vLLM's hybrid allocator): the request's block
hashes are then computed every hash_block_size tokens (the GCD of the groups' block
sizes, vllm/v1/core/kv_cache_utils.py resolve_kv_cache_block_sizes), and a group whose
blocks hold m such positions has one block per m positions.  The connector's positions
are the hashes'; a group's block is stored under the key of the last position it
covers (a chain hash names the whole prefix up to there), and that group has no key at
the other positions (ABSENT in the per-position block ids).  vLLM's hits are multiples
of the LCM of the block sizes, so a hit here ends where every group's block does.
"""

import math

from .common import attr_of

NULL_BLOCK_ID = 0  # vllm/v1/core/block_pool.py: the first block of the pool
# In per-position block ids (GroupSkips.at_positions): the group has no block ending at
# this position -- nothing to save, load or report there.
ABSENT = -1


def hash_block_size(cache_config, kv_cache_config):
    """The tokens per block hash of a request (vLLM main's resolve_kv_cache_block_sizes,
    with a connector configured): one group, the cache's block size; several, the
    cache config's hash_block_size or the GCD of the groups' block sizes -- or their
    LCM where a Mamba group's block size is not the cache's (its mode is not "align").
    Raises ValueError where a group's block size is not a multiple of it, as vLLM does."""
    block_size = int(attr_of(cache_config, "block_size", None) or 16)
    groups = attr_of(kv_cache_config, "kv_cache_groups", None) or []
    sizes = [int(attr_of(attr_of(g, "kv_cache_spec"), "block_size", None) or block_size)
             for g in groups]
    if len(sizes) <= 1:
        return block_size
    if any(_kind(attr_of(g, "kv_cache_spec")) == "MambaSpec" and size != block_size
           for g, size in zip(groups, sizes)):
        return math.lcm(*sizes)
    hashed = attr_of(cache_config, "hash_block_size", None) or math.gcd(*sizes)
    if any(size % hashed for size in sizes):
        raise ValueError("kvengine: hash_block_size %d does not divide every KV-cache "
                         "group's block size %s" % (hashed, sizes))
    return int(hashed)

# vLLM's spec classes (kv_cache_interface.py) whose manager skips tokens, by class name:
# spec_manager_map maps them (and their subclasses, e.g. SlidingWindowMLASpec) to
# SlidingWindowManager, ChunkedLocalAttentionManager and MambaManager.
_SKIPPING = ("SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MambaSpec")


def _kind(spec):
    for cls in type(spec).__mro__:
        if cls.__name__ in _SKIPPING:
            return cls.__name__
    return None  # full attention and the rest: no position ever skipped


class GroupSkips:
    """Which positions of each KV-cache group hold the null block, by vLLM's rule."""

    def __init__(self, kv_cache_config, block_size):
        self._block_size = block_size  # tokens per position (per block hash)
        self._specs = [attr_of(g, "kv_cache_spec")
                       for g in attr_of(kv_cache_config, "kv_cache_groups", None) or []]
        self._kinds = [_kind(s) for s in self._specs]
        # Each group's block size, and its positions per block.
        self._sizes = [int(attr_of(s, "block_size", None) or block_size) for s in self._specs]
        for size in self._sizes:
            # A position of several of a group's blocks (vLLM hashes every LCM tokens
            # when a Mamba group's block size is not the cache's, mamba_cache_mode other
            # than "align"): no one block would hold a position's tokens.
            if size % block_size:
                raise ValueError(
                    "kvengine: a KV-cache group's block size (%d tokens) is not a multiple "
                    "of the request's block hash size (%d tokens), as with a Mamba group "
                    "outside mamba_cache_mode='align': not supported by the connector; "
                    "group block sizes %s" % (size, block_size, self._sizes))
        self._per = [size // block_size for size in self._sizes]
        # A hit ends where every group's block does: a multiple of this many positions.
        self.alignment = math.lcm(*self._per) if self._per else 1

    def uniform(self):
        """Whether every group's block is one position (one block size)."""
        return all(m == 1 for m in self._per)

    def block_size_of(self, group):
        return self._sizes[group] if 0 <= group < len(self._sizes) else self._block_size

    def positions(self, group, num_blocks):
        """The positions num_blocks blocks of the group cover."""
        return num_blocks * (self._per[group] if 0 <= group < len(self._per) else 1)

    def ends_block(self, group, position):
        """Whether one of the group's blocks ends at this position (has a key there)."""
        m = self._per[group] if 0 <= group < len(self._per) else 1
        return (position + 1) % m == 0

    def at_positions(self, block_ids, first, count):
        """Per group, the block id at each position of [first, first + count): the
        group's block ending there, else ABSENT (and ABSENT past its blocks)."""
        out = []
        for g, ids in enumerate(block_ids):
            m = self._per[g] if g < len(self._per) else 1
            if m == 1:
                out.append(list(ids[first:first + count]))
                continue
            row = []
            for p in range(first, first + count):
                j = (p + 1) // m - 1
                row.append(ids[j] if (p + 1) % m == 0 and j < len(ids) else ABSENT)
            out.append(row)
        return out

    def any_nulls(self):
        """Whether some group may be handed the null block."""
        return any(self._kinds)

    def needs_groups(self):
        """Whether a position's keys depend on each layer's group: some group may hold the
        null block, or has blocks of several positions."""
        return self.any_nulls() or not self.uniform()

    def has_nulls(self, group):
        return 0 <= group < len(self._kinds) and self._kinds[group] is not None

    def is_null(self, group, block_id):
        """Whether block_id in this group is vLLM's null block: never saved nor loaded."""
        return block_id == NULL_BLOCK_ID and self.has_nulls(group)

    def skipped_tokens(self, group, num_computed_tokens):
        """The group manager's get_num_skipped_tokens (vLLM main)."""
        kind = self._kinds[group] if self.has_nulls(group) else None
        spec = self._specs[group] if kind else None
        if kind == "SlidingWindowSpec":
            return max(0, num_computed_tokens - int(spec.sliding_window) + 1)
        if kind == "ChunkedLocalAttentionSpec":
            chunk = int(spec.attention_chunk_size)
            return (num_computed_tokens // chunk) * chunk
        if kind == "MambaSpec":
            return num_computed_tokens - 1
        return 0

    def skipped_blocks(self, group, num_computed_tokens):
        """The group's blocks [0, n) vLLM pads with the null block for a request with
        num_computed_tokens computed (allocate_new_computed_blocks)."""
        return max(0, self.skipped_tokens(group, num_computed_tokens)) // \
            self.block_size_of(group)

    def usable(self, start, missing, computed_tokens):
        """[usable] for h in 0..len(missing): whether loading positions
        [start, start + h) needs no bytes the store lacks.  missing[b] is the set of groups
        with a layer key absent at position start + b; computed_tokens(h) the request's
        computed tokens once h positions are loaded (vLLM skips by it).  A group's missing
        position is needed unless vLLM pads it with the null block at that count; a full
        attention group needs every one.  Not monotone: a sliding window's later hit
        skips an earlier hole (vLLM's SlidingWindowManager scans from the right alike)."""
        out = [True]
        last_missing = {}  # group -> the block index of its last missing key so far
        for b, groups in enumerate(missing):
            for g in groups:
                if self.ends_block(g, start + b):  # elsewhere the group has no key
                    last_missing[g] = (start + b + 1) // self._per[g] - 1 \
                        if g < len(self._per) else start + b
            m = computed_tokens(b + 1)
            out.append((start + b + 1) % self.alignment == 0 and
                       all(j < self.skipped_blocks(g, m) for g, j in last_missing.items()))
        return out
