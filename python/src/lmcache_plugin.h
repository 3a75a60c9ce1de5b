// The Python binding of LMCacheQueue: _kvengine.LMCachePlugin, the base of
// kvengine.lmcache.KVEngineL2Plugin (docs/lmcache.md).
#ifndef KVENGINE_PYTHON_SRC_LMCACHE_PLUGIN_H_
#define KVENGINE_PYTHON_SRC_LMCACHE_PLUGIN_H_

#include <pybind11/pybind11.h>

#include <functional>
#include <memory>

#include "kvengine/db.h"

namespace kvengine {
namespace python {

// Returns the DB a _kvengine.Store object holds (nullptr when it is closed); raises
// TypeError for an object that is not a Store.
using StoreDbGetter = std::function<std::shared_ptr<DB>(pybind11::handle store)>;

// Adds the class LMCachePlugin to the module.
void BindLMCachePlugin(pybind11::module_& m, StoreDbGetter db_of);

}  // namespace python
}  // namespace kvengine

#endif  // KVENGINE_PYTHON_SRC_LMCACHE_PLUGIN_H_
