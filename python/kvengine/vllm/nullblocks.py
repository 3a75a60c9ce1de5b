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
"""

from .common import attr_of

NULL_BLOCK_ID = 0  # vllm/v1/core/block_pool.py: the first block of the pool

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
        self._block_size = block_size
        self._specs = [attr_of(g, "kv_cache_spec")
                       for g in attr_of(kv_cache_config, "kv_cache_groups", None) or []]
        self._kinds = [_kind(s) for s in self._specs]

    def any_nulls(self):
        """Whether some group may be handed the null block."""
        return any(self._kinds)

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
        """The positions [0, n) vLLM pads with the null block in this group for a request
        with num_computed_tokens computed (allocate_new_computed_blocks)."""
        return max(0, self.skipped_tokens(group, num_computed_tokens)) // self._block_size

    def usable(self, start, missing, computed_tokens):
        """[usable] for h in 0..len(missing): whether loading positions
        [start, start + h) needs no bytes the store lacks.  missing[b] is the set of groups
        with a layer key absent at position start + b; computed_tokens(h) the request's
        computed tokens once h positions are loaded (vLLM skips by it).  A group's missing
        position is needed unless vLLM pads it with the null block at that count; a full
        attention group needs every one.  Not monotone: a sliding window's later hit
        skips an earlier hole (vLLM's SlidingWindowManager scans from the right alike)."""
        out = [True]
        last_missing = {}  # group -> its last missing position so far (absolute)
        for b, groups in enumerate(missing):
            for g in groups:
                last_missing[g] = start + b
            m = computed_tokens(b + 1)
            out.append(all(pos < self.skipped_blocks(g, m) for g, pos in last_missing.items()))
        return out
