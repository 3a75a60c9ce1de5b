// The Python binding of kvengine::LoadPlanner: _kvengine.LoadPlanner, re-exported as
// kvengine.LoadPlanner (docs/python.md, "The load planner").
#ifndef KVENGINE_PYTHON_SRC_LOAD_PLANNER_BINDING_H_
#define KVENGINE_PYTHON_SRC_LOAD_PLANNER_BINDING_H_

#include <pybind11/pybind11.h>

namespace kvengine {
namespace python {

// Adds the class LoadPlanner to the module.
void BindLoadPlanner(pybind11::module_& m);

}  // namespace python
}  // namespace kvengine

#endif  // KVENGINE_PYTHON_SRC_LOAD_PLANNER_BINDING_H_
