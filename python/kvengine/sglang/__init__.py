"""kvengine as SGLang's HiCache L3 storage backend (docs/sglang.md).

    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
    '{"backend_name": "kvengine", "module_path": "kvengine.sglang",
      "class_name": "KVEngineHiCacheStorage", "interface_v1": 1, "path": "/var/lib/kvcache"}'
"""

from ._sglang_compat import HAVE_SGLANG
from .metrics import KVEngineStorageMetrics
from .storage import KVEngineHiCacheStorage

__all__ = ["KVEngineHiCacheStorage", "KVEngineStorageMetrics", "HAVE_SGLANG"]
