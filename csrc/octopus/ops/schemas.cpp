// The schema of every octopus op, in one place (extension-cpp's catalogue): each family
// registers its kernels for each backend beside its code (TORCH_LIBRARY_IMPL), and its
// fakes and autograd formulas in its Python module (python/octopus/<family>.py).
#include <torch/library.h>

TORCH_LIBRARY(octopus, m) {
  // plan (core/plan_op.cpp: the block plan, the lookup table, the layout check)
  m.def("plan(Tensor offsets, int num_values, int block_elems) -> Tensor");
  m.def("lookup_table(Tensor offsets, int num_values) -> Tensor");
  m.def("validate_layout(Tensor offsets, Tensor? sizes, int num_values) -> ()");
  // affine
  m.def("affine(Tensor values, Tensor offsets, Tensor scale, Tensor bias, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  // pointwise (its kinds: item_param_fns.h)
  m.def("pointwise(Tensor values, Tensor offsets, str kind, Tensor a, Tensor b, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  // crop_resize
  m.def("crop_resize(Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, int channels, int out_h, int out_w, "
        "float scale=1., Tensor? mean=None, Tensor? std=None, bool validate=True) -> Tensor");
  m.def("crop_resize_backward(Tensor grad, Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, "
        "float scale=1., Tensor? std=None) -> Tensor");
  // crop_resize_ragged
  m.def("crop_resize_ragged(Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, int channels, "
        "Tensor out_offsets, Tensor out_sizes, int num_out_values, float scale=1., Tensor? mean=None, Tensor? std=None, "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  m.def("crop_resize_ragged_backward(Tensor grad, Tensor values, Tensor offsets, Tensor sizes, Tensor boxes, "
        "int channels, Tensor out_offsets, Tensor out_sizes, float scale=1., Tensor? std=None) -> Tensor");
  // item_stats
  m.def("item_stats(Tensor values, Tensor offsets, int channels=0, int block_elems=0, Tensor? plan=None, "
        "bool validate=True) -> Tensor");
  // normalize (a composite of item_stats and pointwise)
  m.def("normalize(Tensor values, Tensor offsets, int channels=0, float eps=1e-5, int correction=0, "
        "Tensor? mean=None, Tensor? std=None, int stats_block_elems=0, Tensor? plan=None, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None) -> Tensor");
  // padding: to_padded, from_padded
  m.def("to_padded(Tensor values, Tensor offsets, Tensor sizes, int[] max_shape, float pad_value=0., "
        "bool validate=True) -> Tensor");
  m.def("from_padded(Tensor padded, Tensor offsets, Tensor sizes, int num_values, str strategy=\"plan\", "
        "int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  // sampler_step
  m.def(
      "sampler_step(Tensor model_output, Tensor sample, Tensor offsets, Tensor timesteps, Tensor schedules, "
      "Tensor tables, Tensor row_info, Tensor row_scalars, Tensor? sample_rows=None, Tensor? noise=None, "
      "Tensor(a!)? state=None, bool return_x0=False, str strategy=\"block_search\", Tensor? metadata=None) "
      "-> (Tensor, Tensor)");
  // stencil: stencil3x3 and its adjoint
  m.def("stencil3x3(Tensor values, Tensor offsets, Tensor sizes, Tensor weight, str border=\"replicate\", "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  m.def("stencil3x3_backward(Tensor grad, Tensor offsets, Tensor sizes, Tensor weight, str border=\"replicate\", "
        "str strategy=\"plan\", int block_elems=0, Tensor? metadata=None, bool validate=True) -> Tensor");
  // tile_stats
  m.def("tile_stats(Tensor image, Tensor tiles, float threshold, float min_mean, float max_mean, "
        "float min_fraction, float max_fraction, bool validate=True) -> (Tensor, Tensor, Tensor)");
}
