// polykv._core: the native half of the polykv package. The Python modules
// (polykv/*.py) wrap it with context managers and dataclasses; use those.
#include "client/python/src/bindings.h"

NB_MODULE(_core, m) {
  m.doc() = "polykv's native bindings (use the polykv package, not this module)";
  polykv::python::BindErrors(m);
  polykv::python::BindClient(m);
  polykv::python::BindAdmin(m);
  polykv::python::BindKvStore(m);
  polykv::python::BindPrefixCache(m);
}
