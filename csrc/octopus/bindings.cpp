// The Python extension module. Importing it registers the torch ops (their static
// registrations run when the library loads); it also reports how it was built.
#include <pybind11/pybind11.h>

PYBIND11_MODULE(_C, m) {
  m.doc() = "octopus native library: torch.ops.octopus.* and build information";
#if defined(OCTOPUS_WITH_CUDA)
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
}
