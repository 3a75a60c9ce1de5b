"""The model fingerprint the integrations put in their keys (docs/vllm.md and
docs/sglang.md, "Keys and values"): a short hash of what makes a cached block's bytes
reusable, so that a restart with another model, a new revision or a changed config
behind the same name is a clean miss, never another model's bytes.

Each integration describes its instance as a JSON-able dict (model, revision, dtype,
block or page size, parallel shape, and the model config's fields of HF_KV_FIELDS),
fingerprints it (fingerprint_of), puts the fingerprint in every key, and once at start
compares it with the record the store keeps for the model's name (check_fingerprint),
warning when it changed.
"""

import hashlib
import json
import logging
import os

# The fields of a model's config (a transformers PretrainedConfig, or its config.json)
# that change what its KV cache holds for the same tokens: the attention geometry, the
# position encoding, the latent (MLA) shape, quantisation.  Absent fields are skipped;
# fields that change nothing in the cache (vocab_size, transformers_version) are left out
# so that they do not turn every block into a miss.
HF_KV_FIELDS = ("model_type", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_size", "rope_theta",
                "rope_scaling", "rope_parameters", "partial_rotary_factor", "rotary_dim",
                "max_position_embeddings", "position_embedding_type", "sliding_window",
                "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim",
                "quantization_config")


def fingerprint_of(parts: dict) -> str:
    """The fingerprint of a description (a JSON-able dict): 16 hex digits of its SHA-256."""
    text = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_fields(config, names=HF_KV_FIELDS) -> dict:
    """The fields `names` that `config` (an object or a dict) has and are not None."""
    out = {}
    for name in names:
        value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
        if value is not None:
            if hasattr(value, "to_dict"):  # transformers' quantization config objects
                value = value.to_dict()
            out[name] = value
    return out


def read_config_json(model_path, revision=None):
    """The model's config.json as a dict: from model_path when it is a directory, else
    from the Hugging Face cache when huggingface_hub is installed and holds it (the
    serving framework downloaded it to load the model); {} when neither has it."""
    path = None
    if model_path and os.path.isdir(model_path):
        path = os.path.join(model_path, "config.json")
    elif model_path:
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(model_path, "config.json", revision=revision)
            path = found if isinstance(found, str) else None
        except Exception:  # noqa: BLE001 -- not installed, or not a repo id
            path = None
    if path is None or not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def check_fingerprint(db, record_key, name, fingerprint, parts, logger) -> str:
    """Compares `fingerprint` with the one recorded under record_key in the store, then
    records it (with `parts`, the description it was hashed from).  A different one is
    logged at warning on `logger`, naming `name`, both fingerprints and the parts that
    differ.  Returns the old fingerprint when it differed, else None."""
    parts = json.loads(json.dumps(parts, default=str))
    mine = ("%s\n%s" % (fingerprint, json.dumps(parts, sort_keys=True))).encode()
    raw = bytes(db.get(record_key))
    old = None
    if raw and raw != mine:
        try:
            old_fp, old_json = raw.decode().split("\n", 1)
            old_parts = json.loads(old_json)
        except ValueError:
            old_fp, old_parts = raw[:16].decode("ascii", "replace"), {}
        if old_fp != fingerprint:
            old = old_fp
            changed = sorted(k for k in set(old_parts) | set(parts)
                             if old_parts.get(k) != parts.get(k))
            logger.warning(
                "kvengine: the model behind %s changed since this store last saw it: "
                "fingerprint %s, was %s (differs in: %s). The blocks saved before are "
                "misses (their keys carry the old fingerprint), never reused.",
                name, fingerprint, old_fp, ", ".join(changed) or "unknown")
    if raw != mine:
        rc = db.put(record_key, mine)
        if rc != 0:
            logger.warning("kvengine: could not record the model fingerprint (%d)", rc)
    return old
