// The `lockstep` extension module (_lockstep); python/lockstep/__init__.py re-exports it.
#include "bindings.h"

#include "core/check.h"
#include "trace/trace_observer.h"

namespace py = pybind11;

PYBIND11_MODULE(_lockstep, m) {
  m.doc() = "lockstep: the executor, forward ops, the foreign-executor trace writer and the trace reader";
  // Every ls::Error (a malformed op, a limit, a corrupt trace) is a lockstep.Error, a ValueError.
  py::register_exception<ls::Error>(m, "Error", PyExc_ValueError);
  m.attr("__version__") = ls::trace::version();
  // What a trace this module records names as its writer (Header.build_id), as `lockstep
  // --version` prints it.
  m.attr("build_id") = ls::trace::build_id();
  ls::py_bindings::bind_forward_op(m);
  ls::py_bindings::bind_executor(m);
  ls::py_bindings::bind_trace(m);
}
