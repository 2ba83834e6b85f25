// octopus._graph_replay.replay_graph: a captured torch.cuda.CUDAGraph replayed without
// letting go of the GIL (python/octopus/scheduling/graphs.py wraps it).
//
// torch's CUDAGraph.replay() binding lets go of the GIL for the launch. A latency-critical
// thread that replays a graph hands the GIL to whichever thread wants it, and gets it back only
// when that thread lets go (its Python may run up to a switch interval): on an H200, a batch-1
// conv net's graph beside an eager octopus op in another thread took 0.32-0.33 ms at the median
// from its launch to the record of an event after it when the other job started meanwhile,
// against 0.07 ms through this, its events recorded with the GIL held too (benchmarks/JOURNAL.md,
// thirtieth session). This is torch's own replay
// (at::cuda::CUDAGraph::replay: random-number offsets advanced as torch advances them), on the
// given stream, with the GIL kept.
//
// This module is compiled against torch's own copy of pybind11 (CMakeLists.txt), so that it
// shares torch's pybind11 internals and can take the Python graph as the C++ object torch binds;
// octopus._C uses the pybind11 package, whose internals may be another version's.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>

#if defined(OCTOPUS_WITH_CUDA)
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace py = pybind11;

PYBIND11_MODULE(_graph_replay, m) {
  m.doc() = "octopus: a CUDA graph replayed without letting go of the GIL";
  m.def("replay_graph", [](py::handle graph, std::uintptr_t stream, int device) {
#if defined(OCTOPUS_WITH_CUDA)
    at::cuda::CUDAGraph& g = graph.cast<at::cuda::CUDAGraph&>();
    c10::cuda::CUDAStreamGuard on_stream(c10::cuda::getStreamFromExternal(
        reinterpret_cast<cudaStream_t>(stream), static_cast<c10::DeviceIndex>(device)));
    g.replay();
#else
    (void)graph;
    (void)stream;
    (void)device;
    throw std::runtime_error("octopus.replay_graph needs octopus built with CUDA; this build has none");
#endif
  }, py::arg("graph"), py::arg("stream"), py::arg("device"));
}
