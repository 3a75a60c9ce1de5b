"""How the SGLang backend spells a page's key (docs/sglang.md, "Keys and values").

    sglang/<model>@<dtype>@<kind><geometry>@<layout>@ps<page size>@<ranks>/<page hash>
    e.g. sglang/meta-llama--Llama-3-8B@bfloat16@mhaL32H8D128@page_first@ps64@tp0of2@pp0of1/9f2c...

<ranks> is tp<r>of<n>@pp<r>of<n> for MHA (each tensor-parallel rank stores its own
heads) and pp<r>of<n> for MLA (one latent cache that every rank holds alike: rank 0
writes it, every rank reads it), plus @cp<r>of<n> under attention context parallelism.
Anything that changes a page's bytes or their order -- model, dtype, head geometry,
host layout, page size, parallel shape -- changes the key, so two SGLang
configurations never read each other's bytes.  The first segment is "sglang", which
no vLLM connector key can have (theirs is "<model>@<dtype>@...@pp<r>of<n>"), so
SGLang pages and vLLM blocks in one store never collide.

Pages written through the copy path (set/batch_set with flat tensors) are SGLang's
"flat data page", whose byte order differs from the zero-copy value's for MHA
layer_first pools, so they carry the layout "flat-<layout>".
"""

from .. import regex_escape

NAMESPACE = "sglang"


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


def model_tag(model_name):
    """The model as it appears in keys: SGLang's model path with '/' made '--'."""
    return (model_name or "model").replace("/", "--")


def model_pattern(model_name):
    """A regex matching, whole, every page key of the model (every dtype, rank and
    layout) and nothing else: what clear() removes."""
    return regex_escape("%s/%s@" % (NAMESPACE, model_tag(model_name))) + ".*"


def geometry(pool, is_mla):
    """The part of a page's shape that its bytes depend on besides the page size:
    layers and heads x head size (MHA), or layers and latent width (MLA)."""
    if is_mla:
        return "mlaL%dC%d" % (pool.layer_num, pool.kv_cache_dim)
    return "mhaL%dH%dD%d" % (pool.layer_num, pool.head_num, pool.head_dim)


class PageKeys:
    """The keys of one backend instance's pages, from its storage config and host pool."""

    def __init__(self, config, pool):
        # The device pool's dtype: an fp8 pool is held as uint8 on the host
        # (store_dtype), so the host dtype alone would not tell e4m3 from e5m2.
        device_pool = getattr(pool, "device_pool", None)
        dtype = getattr(device_pool, "dtype", None) or pool.dtype
        ranks = "pp%dof%d" % (config.pp_rank, config.pp_size)
        if not config.is_mla_model:
            ranks = "tp%dof%d@%s" % (config.tp_rank, config.tp_size, ranks)
        if config.attn_cp_size > 1:
            ranks += "@cp%dof%d" % (config.attn_cp_rank, config.attn_cp_size)
        self._head = "%s/%s@%s@%s" % (NAMESPACE, model_tag(config.model_name),
                                      _dtype_name(dtype), geometry(pool, config.is_mla_model))
        self._tail = "@ps%d@%s/" % (pool.page_size, ranks)
        self.prefix = "%s@%s%s" % (self._head, pool.layout, self._tail)
        self.flat_prefix = "%s@flat-%s%s" % (self._head, pool.layout, self._tail)

    def pages(self, hashes):
        """The zero-copy (batch_get_v1/batch_set_v1) key of each page hash."""
        prefix = self.prefix
        return [prefix + h for h in hashes]

    def flat(self, page_hash):
        """The copy path's key of a page hash."""
        return self.flat_prefix + page_hash
