"""The load planner's settings, as every integration reads them from its extra config
(vLLM's kv_connector_extra_config, SGLang's hicache-storage-backend-extra-config):

    "load_planner": True                     # default; False loads every hit
    "recompute_tokens_per_s": 40000          # the engine's prefill rate on this GPU and
                                             # model; unset: every hit is loaded (logged
                                             # once, naming this option)
    "load_planner_options": {"ssd_bytes_per_s": 3e9, "ssd_latency_s": 1e-4, ...}
                                             # kvengine.LoadPlanner's keyword arguments:
                                             # the tiers' figures, overlap_layers,
                                             # estimate_weight, margin; a tier's figure
                                             # stated here was measured on this host and
                                             # is trusted from the first plan (its
                                             # <tier>_samples default to TRUSTED_LOADS)

kvengine.LoadPlanner (include/kvengine/load_planner.h) does the planning; this module
only reads and checks the settings.
"""

from . import LoadPlanner

PLANNER_OPTIONS = ("memory_bytes_per_s", "memory_latency_s", "ssd_bytes_per_s",
                   "ssd_latency_s", "peer_bytes_per_s", "peer_latency_s", "overlap_layers",
                   "estimate_weight", "margin", "memory_samples", "ssd_samples",
                   "peer_samples")
_TIERS = ("memory", "ssd", "peer")
_COUNTS = ("overlap_layers", "memory_samples", "ssd_samples", "peer_samples")


def planner_kwargs(extra, where):
    """kvengine.LoadPlanner's keyword arguments from an extra config (`where` names it in
    messages); None when the planner is off.  A bad value raises ValueError naming it
    (checked by building a planner once)."""
    if not extra.get("load_planner", True):
        return None
    options = extra.get("load_planner_options") or {}
    if not isinstance(options, dict):
        raise ValueError("%s['load_planner_options'] must be an object, not %r"
                         % (where, options))
    unknown = sorted(set(options) - set(PLANNER_OPTIONS))
    if unknown:
        raise ValueError("%s['load_planner_options'] has unknown option(s) %s; known: %s"
                         % (where, ", ".join(unknown), ", ".join(PLANNER_OPTIONS)))
    kwargs = {}
    pairs = list(options.items()) + [("recompute_tokens_per_s",
                                      extra.get("recompute_tokens_per_s"))]
    for name, value in pairs:
        if value is None:
            continue
        try:
            kwargs[name] = int(value) if name in _COUNTS else float(value)
        except (TypeError, ValueError):
            raise ValueError("%s: %s must be a number, not %r" % (where, name, value)) from None
    # A figure a deployment states is its own measurement: trusted as that many loads.
    # Unstated, the planner starts from its nominal guess and prices a slower tier
    # cautiously until loads have measured it (include/kvengine/load_planner.h).
    for tier in _TIERS:
        stated = any(name in kwargs for name in (tier + "_bytes_per_s", tier + "_latency_s"))
        if stated and tier + "_samples" not in kwargs:
            kwargs[tier + "_samples"] = LoadPlanner.TRUSTED_LOADS
    try:
        LoadPlanner(**kwargs)
    except (ValueError, TypeError) as e:
        raise ValueError("%s: %s" % (where, e)) from None
    return kwargs
