// The CPU backend of an op body written once for every backend (`template <class Backend>
// at::Tensor op(...)`, in the op family's header): what differs between the CPU and CUDA
// entry points of a ragged op, and nothing else. The CUDA backend is in backend_cuda.cuh.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>

#include "octopus/core/checks.h"
#include "octopus/core/driver_cpu.h"
#include "octopus/core/metadata.h"

namespace octopus {

struct CpuBackend {
  struct Guard {
    explicit Guard(const c10::Device&) {}
  };
  // Whether the call may read the layout's contents on the host to check them. The CPU
  // always does: O(M) beside the O(N) op, and a bad layout would crash the process.
  static bool may_read_host(bool /*validate*/) { return true; }
  static at::Tensor build_plan(const at::Tensor& offsets, int64_t num_values, int64_t block_elems) {
    return build_plan_cpu(offsets, num_values, block_elems);
  }
  template <class Op>
  static void run(const Op& op, Strategy strategy, const at::Tensor& offsets, int64_t num_values, int64_t block_elems,
                  const at::Tensor& metadata) {
    run_ragged_cpu(op, strategy, offsets, num_values, block_elems, metadata);
  }
};

}  // namespace octopus
