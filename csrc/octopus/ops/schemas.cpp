// The catalogue of octopus ops: every op's schema, with its CPU kernel (or its composite
// implementation) registered beside it, as extension-cpp does. The CUDA kernels are registered
// in each family's .cu (TORCH_LIBRARY_IMPL), the fakes and autograd formulas in its Python
// module (python/octopus/<family>.py).
#include <torch/library.h>

#include "octopus/core/backend.h"
#include "octopus/core/metadata.h"
#include "octopus/ops/affine.h"
#include "octopus/ops/crop_resize.h"
#include "octopus/ops/crop_resize_ragged.h"
#include "octopus/ops/item_stats.h"
#include "octopus/ops/normalize.h"
#include "octopus/ops/padding.h"
#include "octopus/ops/pointwise.h"
#include "octopus/ops/sampler_step_args.h"
#include "octopus/ops/stencil.h"
#include "octopus/ops/tile_stats.h"

namespace octopus {
namespace {

template <class Fn>
torch::CppFunction cpu(Fn* kernel) {
  return torch::dispatch(c10::DispatchKey::CPU, kernel);
}

}  // namespace

TORCH_LIBRARY(octopus, m) {
  // plan (core/plan_op.cpp: the block plan, the lookup table, the layout check)
  m.def("plan(Tensor offsets, int num_values, int block_elems) -> Tensor",
        cpu(&plan_cpu_op));
  m.def("lookup_table(Tensor offsets, int num_values) -> Tensor",
        cpu(&lookup_table_cpu_op));
  m.def("validate_layout(Tensor offsets, Tensor? sizes, int num_values) -> ()",
        torch::dispatch(c10::DispatchKey::CompositeExplicitAutograd, &validate_layout_op));
  // affine
  m.def("affine(Tensor values, Tensor offsets, Tensor scale, Tensor bias, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&affine<CpuBackend>));
  // pointwise (its kinds: item_param_fns.h)
  m.def("pointwise(Tensor values, Tensor offsets, str kind, Tensor a, Tensor b, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&pointwise<CpuBackend>));
  // crop_resize
  m.def("crop_resize(Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, int channels, int out_h, int out_w, "
        "float scale=1., Tensor? mean=None, Tensor? std=None, bool validate=True) -> Tensor",
        cpu(&crop_resize_cpu));
  m.def("crop_resize_backward(Tensor grad, Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, "
        "float scale=1., Tensor? std=None) -> Tensor",
        cpu(&crop_resize_backward_cpu));
  // crop_resize_ragged
  m.def("crop_resize_ragged(Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, int channels, "
        "Tensor out_offsets, Tensor out_sizes, int num_out_values, float scale=1., Tensor? mean=None, Tensor? std=None, "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&crop_resize_ragged<CpuBackend>));
  m.def("crop_resize_ragged_backward(Tensor grad, Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, "
        "int channels, Tensor out_offsets, Tensor out_sizes, float scale=1., Tensor? std=None) -> Tensor",
        cpu(&crop_resize_ragged_backward_cpu));
  // item_stats
  m.def("item_stats(Tensor values, Tensor offsets, int channels=0, int block_elems=0, Tensor? plan=None, "
        "bool validate=True) -> Tensor",
        cpu(&item_stats_cpu));
  // normalize (a composite of item_stats, normalize_constants and pointwise)
  m.def("normalize_constants(Tensor stats, Tensor offsets, int channels, float eps, int correction, "
        "ScalarType dtype) -> (Tensor, Tensor)",
        cpu(&normalize_constants_cpu));
  m.def("normalize(Tensor values, Tensor offsets, int channels=0, float eps=1e-5, int correction=0, "
        "Tensor? mean=None, Tensor? std=None, int stats_block_elems=0, Tensor? plan=None, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None) -> Tensor",
        torch::dispatch(c10::DispatchKey::CompositeImplicitAutograd, &normalize));
  // padding: to_padded, from_padded
  m.def("to_padded(Tensor values, Tensor offsets, Tensor sizes, int[] max_shape, float pad_value=0., "
        "bool validate=True) -> Tensor",
        cpu(&to_padded_cpu));
  m.def("from_padded(Tensor padded, Tensor offsets, Tensor sizes, int num_values, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&from_padded<CpuBackend>));
  // sampler_step
  m.def(
      "sampler_step(Tensor model_output, Tensor sample, Tensor offsets, Tensor timesteps, Tensor schedules, "
      "Tensor tables, Tensor row_info, Tensor row_scalars, Tensor? sample_rows=None, Tensor? noise=None, "
      "Tensor(a!)? state=None, bool return_x0=False, str strategy=\"block_search\", Tensor? metadata=None) "
      "-> (Tensor, Tensor)",
      cpu(&sampler_step<CpuSamplerBackend>));
  // stencil: stencil3x3 and its adjoint
  m.def("stencil3x3(Tensor values, Tensor offsets, Tensor sizes, Tensor weight, str border=\"replicate\", "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&stencil3x3<CpuBackend, false>));
  m.def("stencil3x3_backward(Tensor grad, Tensor offsets, Tensor sizes, Tensor weight, str border=\"replicate\", "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor",
        cpu(&stencil3x3<CpuBackend, true>));
  // tile_stats
  m.def("tile_stats(Tensor image, Tensor tiles, float threshold, float min_mean, float max_mean, "
        "float min_fraction, float max_fraction, bool validate=True) -> (Tensor, Tensor, Tensor)",
        cpu(&tile_stats_cpu));
}

}  // namespace octopus
