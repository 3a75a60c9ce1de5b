"""How the SGLang backend spells a page's key (docs/sglang.md, "Keys and values").

    sglang/<model>@<dtype>@<kind><geometry>@<layout>@ps<page size>@<ranks>@m<fingerprint>/<page hash>
    e.g. sglang/meta-llama--Llama-3-8B@bfloat16@mhaL32H8D128@page_first@ps64@tp0of2@pp0of1@m3c1f0e9a2b7d4410/9f2c...

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

The fingerprint (model_fingerprint) hashes what the key does not spell out but the bytes
depend on: the model's path and revision, its quantisation and KV cache dtype (from
SGLang's server args), and the KV fields of its config.json.
"""

import json

from .. import regex_escape
from ..fingerprint import config_fields, fingerprint_of, read_config_json
from ._sglang_compat import HAVE_SGLANG

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
    layers and heads x head size (MHA), or layers and latent width (MLA); "logical" for
    a hybrid model's logical anchor (SGLang's LogicalHostPool: indices, no bytes)."""
    if getattr(pool, "kv_buffer", None) is None:
        return "logical"
    if is_mla:
        return "mlaL%dC%d" % (pool.layer_num, pool.kv_cache_dim)
    return "mhaL%dH%dD%d" % (pool.layer_num, pool.head_num, pool.head_dim)


def server_args():
    """SGLang's server args of this process (model_path, revision, dtype ...); None
    outside SGLang or before they are published."""
    if not HAVE_SGLANG:
        return None
    try:  # pragma: no cover - only inside an SGLang installation
        from sglang.srt.server_args import get_global_server_args

        return get_global_server_args()
    except Exception:  # noqa: BLE001 -- not published in this process
        return None


def model_config(model_path, revision, override_args):
    """The model's config.json fields (fingerprint.read_config_json), with SGLang's
    --json-model-override-args applied as SGLang applies them."""
    config = read_config_json(model_path, revision)
    if override_args:
        try:
            overrides = json.loads(override_args) if isinstance(override_args, str) \
                else dict(override_args)
            config.update(overrides)
        except (TypeError, ValueError):
            pass
    return config


def model_fingerprint(config, pool, dtype, args=None):
    """(fingerprint, description) of what makes this instance's pages reusable: the
    model name, path and revision, dtype and KV cache dtype, quantisation, page geometry
    and layout, page size, parallel shape, and the config fields of
    fingerprint.HF_KV_FIELDS."""
    def arg(name):
        return getattr(args, name, None) if args is not None else None

    model_path = arg("model_path") or config.model_name
    revision = arg("revision")
    parts = {
        "model": config.model_name,
        "model_path": model_path,
        "revision": revision,
        "dtype": _dtype_name(dtype),
        "kv_cache_dtype": arg("kv_cache_dtype"),
        "quantization": arg("quantization"),
        "geometry": geometry(pool, config.is_mla_model),
        "layout": pool.layout,
        "page_size": pool.page_size,
        "tp": config.tp_size,
        "pp": config.pp_size,
        "cp": config.attn_cp_size,
        "config": config_fields(model_config(model_path, revision,
                                             arg("json_model_override_args"))),
    }
    return fingerprint_of(parts), parts


class PageKeys:
    """The keys of one backend instance's pages, from its storage config and host pool."""

    def __init__(self, config, pool):
        # The device pool's dtype: an fp8 pool is held as uint8 on the host
        # (store_dtype), so the host dtype alone would not tell e4m3 from e5m2.
        device_pool = getattr(pool, "device_pool", None)
        dtype = getattr(device_pool, "dtype", None) or pool.dtype
        shared = "pp%dof%d" % (config.pp_rank, config.pp_size)
        if config.attn_cp_size > 1:
            shared += "@cp%dof%d" % (config.attn_cp_rank, config.attn_cp_size)
        # A rank's own pages (MHA heads, a TP-sharded state) name the TP rank; pages every
        # rank holds alike (MLA's latent cache) do not.
        self._per_rank = "tp%dof%d@%s" % (config.tp_rank, config.tp_size, shared)
        self._shared = shared
        ranks = shared if config.is_mla_model else self._per_rank
        self.fingerprint, self.fingerprint_parts = model_fingerprint(config, pool, dtype,
                                                                     server_args())
        self.name = "%s/%s@%s" % (NAMESPACE, model_tag(config.model_name), _dtype_name(dtype))
        self.fingerprint_record_key = "%s@ps%d@tp%d@pp%d@cp%d/fingerprint" % (
            self.name, pool.page_size, config.tp_size, config.pp_size, config.attn_cp_size)
        self._head = "%s@%s" % (self.name, geometry(pool, config.is_mla_model))
        self._page_size = pool.page_size
        self._ranks = ranks
        self._tail = "@ps%d@%s@m%s/" % (pool.page_size, ranks, self.fingerprint)
        self._layout = pool.layout
        self._value = pool.layout  # what the zero-copy value holds: the layout, members
        self.prefix = "%s@%s%s" % (self._head, pool.layout, self._tail)
        self.flat_prefix = "%s@flat-%s%s" % (self._head, pool.layout, self._tail)

    def group_with(self, members):
        """Makes each page's zero-copy value a page group: the KV page and, laid after
        it, the members named (e.g. "indexer:4096"), one value under one key.  The
        members are spelled in the key, so a grouped page and a KV-only page never
        share a key."""
        self._value = "%s+%s" % (self._layout, members)
        self.prefix = "%s@%s%s" % (self._head, self._value, self._tail)

    def group_prefix(self, member, per_rank, flat=False):
        """The key prefix of a trailing pool's page groups (a Mamba state, SWA pages):
        the zero-copy KV value's segment with "+<member>" after it (e.g.
        "page_first+mamba:8192+..."), so a group never shares a key with a KV page; the
        TP rank too when the member is each rank's own (per_rank) and the KV is not (an
        MLA model's Mamba state).  On the copy path (flat) the KV part is the flat page,
        and the segment is "flat-<layout>+<member>"."""
        ranks = self._per_rank if per_rank else self._ranks
        value = "flat-" + self._layout if flat else self._value
        return "%s@%s+%s@ps%d@%s@m%s/" % (self._head, value, member, self._page_size,
                                          ranks, self.fingerprint)

    def pool_prefix(self, pool_name, shape, layout, page_size, per_rank):
        """The key prefix of a hybrid model's side pool (mamba, swa, ...): the pool's
        name and page shape (the sizes of its parts), layout and page size, and the TP
        rank when each rank holds its own (per_rank)."""
        return "%s@%s:%s@%s@ps%d@%s@m%s/" % (
            self.name, pool_name, shape, layout, page_size,
            self._per_rank if per_rank else self._shared, self.fingerprint)

    def pages(self, hashes):
        """The zero-copy (batch_get_v1/batch_set_v1) key of each page hash."""
        prefix = self.prefix
        return [prefix + h for h in hashes]

    def flat(self, page_hash):
        """The copy path's key of a page hash."""
        return self.flat_prefix + page_hash
