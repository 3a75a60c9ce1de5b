"""Block geometry of a vLLM KV-cache tensor, read from its shape and strides.

vLLM's attention backends have laid a layer's cache out in several ways (docs/vllm.md):

    (2, num_blocks, block_size, heads, head_size)     FlashAttention until 2025, K/V outermost
    (num_blocks, 2, block_size, heads, head_size)     blocks first, K then V inside a block
    (num_blocks, heads, block_size, 2*head_size)      packed: K and V share the content dim;
                                                      physical order from the backend's
                                                      get_kv_cache_stride_order (NHD: tokens
                                                      outermost, HND: heads outermost)
    (num_blocks, 2*heads, block_size, padded_dim)     packed heads (FlashInfer nvfp4)
    (num_blocks, block_size, head_size)               MLA

Rather than matching that list, analyse_layer finds the block dimension, takes the
sub-tensor of one block and splits it into the fewest dense byte runs ("segments"): one
run when a block is contiguous, two (K and V) for the K/V-outermost layout.  A layer's
value for one block is its segments concatenated, which is the block's bytes in memory
order.  The layout tag names that byte order (the dims of a block, outermost first, with
their sizes), so caches whose bytes differ never share keys while, for example, the
FlashAttention and blocks-first layouts (the same bytes: K then V, each NHD) do.
"""

import dataclasses
import itertools
from typing import Any, Optional

# Names of a block's logical dims (the tensor's dims without the block dim), by rank.
_DIM_NAMES = {
    5: "SNHD",  # S: the K/V split
    4: "HNC",  # C: the content dim (2*head_size, plus any scale padding)
    3: "ND",  # MLA: tokens x latent
}


@dataclasses.dataclass
class LayerGeometry:
    num_blocks: int
    block_stride: int  # bytes from one block to the next
    segments: list  # byte offsets, from the block's first byte, of its dense runs
    segment_bytes: int
    tag: str  # the in-block byte layout, e.g. "N16H4C256"
    sizes: Optional[list] = None  # each segment's bytes, where they differ (state layers)

    def segment_sizes(self):
        return self.sizes if self.sizes is not None else [self.segment_bytes] * len(
            self.segments)

    @property
    def block_bytes(self):
        return sum(self.segment_sizes())


def _dtype_tag(dtype):
    return str(dtype).replace("torch.", "").replace("float", "f").replace("bfloat", "bf")


def analyse_state_layer(name: str, tensors: Any) -> LayerGeometry:
    """The geometry of a Mamba (linear-attention) layer's cache: vLLM hands it as a list
    of state tensors (conv state, SSM state ...), each (num_blocks, *shape), views of one
    buffer with one block's states side by side (page_size_bytes apart,
    gpu_model_runner._reshape_kv_cache_tensors).  A block's value is each state's bytes
    of that block, in the list's order.  ValueError naming the layer when the states are
    not such views (blocks not outermost, a block's state not contiguous, or blocks of
    different strides)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("kv cache of layer %s: an empty list of state tensors" % name)
    num_blocks = tensors[0].shape[0]
    stride = tensors[0].stride()[0] * tensors[0].element_size()
    first = min(t.data_ptr() for t in tensors)
    segments, sizes, tags = [], [], []
    for t in tensors:
        elt = t.element_size()
        expected = 1
        for d in range(t.dim() - 1, 0, -1):
            if t.shape[d] != 1 and t.stride()[d] != expected:
                _fail(name, t, "a block's state is not contiguous")
            expected *= t.shape[d]
        if t.shape[0] != num_blocks or t.stride()[0] * elt != stride:
            _fail(name, t, "the states' blocks differ in number or stride")
        if expected * elt > stride:
            _fail(name, t, "a block's state is larger than the block stride")
        segments.append(t.data_ptr() - first)
        sizes.append(expected * elt)
        # e.g. "f32s2x8": the dtype, then "s" and the state's shape
        tags.append("%ss%s" % (_dtype_tag(t.dtype), "x".join(str(x) for x in t.shape[1:])))
    return LayerGeometry(num_blocks=num_blocks, block_stride=stride, segments=segments,
                         segment_bytes=max(sizes), tag="M" + "_".join(tags), sizes=sizes)


def _fail(name, tensor, why):
    raise ValueError(
        "kv cache of layer %s has an unsupported layout: shape %s, strides %s (elements), "
        "dtype %s: %s" % (name, tuple(tensor.shape), tuple(tensor.stride()),
                          str(tensor.dtype).replace("torch.", ""), why))


def _block_dim(tensor, num_blocks_hint, shape_hint):
    shape = tuple(tensor.shape)
    if tensor.dim() == 5 and shape[0] == 2:
        if shape[1] != 2:
            return 1  # (2, num_blocks, ...) unless there are exactly two blocks
        if num_blocks_hint == 2 and shape_hint == "blocks_first":
            return 0
        return 1
    return 0


def analyse_layer(name: str, tensor: Any, block_size: int,
                  num_blocks_hint: Optional[int] = None,
                  shape_hint: Optional[str] = None) -> LayerGeometry:
    """The geometry of one layer's cache; ValueError naming shape and strides when kvengine
    cannot read it as whole blocks of block_size tokens."""
    if tensor.dim() not in _DIM_NAMES:
        _fail(name, tensor, "expected 3 (MLA), 4 (packed K/V) or 5 (split K/V) dims")
    bd = _block_dim(tensor, num_blocks_hint, shape_hint)
    strides = tensor.stride()
    shape = tuple(tensor.shape)
    names = _DIM_NAMES[tensor.dim()]
    # Names of the tensor's dims; the K/V split of the (2, num_blocks, ...) layout is
    # dim 0 and the block dim is 1.
    dim_names = list(names)
    dim_names.insert(bd, "B")
    if tensor.dim() == 5 and bd == 1:
        dim_names = ["S", "B"] + list(names[1:])
    block_dims = [d for d in range(tensor.dim()) if d != bd]
    if block_size not in [shape[d] for d in block_dims if dim_names[d] == "N"]:
        _fail(name, tensor, "no dim of block_size %d tokens where one is expected"
              % block_size)
    # Inner dims first; size-1 dims carry no bytes.
    order = sorted((d for d in block_dims if shape[d] != 1),
                   key=lambda d: (strides[d], shape[d]))
    dense, expected = [], 1
    for d in order:
        if strides[d] != expected:
            break
        dense.append(d)
        expected *= shape[d]
    outer = [d for d in order if d not in dense]
    if not dense:
        _fail(name, tensor, "the innermost dim is not contiguous")
    if any(strides[d] < expected for d in outer):
        _fail(name, tensor, "the dims of a block interleave")
    if strides[bd] < expected and shape[bd] > 1:
        _fail(name, tensor, "blocks overlap or are not the outer dim")
    for d in block_dims:
        if strides[d] > strides[bd] and dim_names[d] != "S":
            _fail(name, tensor, "the block dim is not outside the other dims")
    elt = tensor.element_size()
    outer = sorted(outer, key=lambda d: -strides[d])
    segments = []
    for idx in itertools.product(*[range(shape[d]) for d in outer]):
        segments.append(sum(i * strides[d] for i, d in zip(idx, outer)) * elt)
    memory_order = outer + sorted(dense, key=lambda d: -strides[d])
    tag = "".join("%s%d" % (dim_names[d], shape[d]) for d in memory_order)
    return LayerGeometry(num_blocks=shape[bd], block_stride=strides[bd] * elt,
                         segments=segments, segment_bytes=expected * elt, tag=tag)
