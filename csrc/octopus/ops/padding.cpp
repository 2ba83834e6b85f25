// octopus::to_padded / octopus::from_padded — argument handling and the CPU kernels (from_padded's
// body is padding.h's; the schemas are in schemas.cpp).
#include "octopus/ops/padding.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <vector>


namespace octopus {

namespace {

void check_sizes_tensor(const at::Tensor& sizes, const at::Tensor& offsets) {
  TORCH_CHECK_TYPE(sizes.scalar_type() == at::kLong, "sizes must be int64, got ", sizes.scalar_type());
  TORCH_CHECK_VALUE(sizes.dim() == 2 && sizes.size(0) == offsets.numel() - 1, "sizes must have shape [num_items, D] = (",
                    offsets.numel() - 1, ", D), got ", format_shape(sizes.sizes()));
  TORCH_CHECK_VALUE(sizes.size(1) >= 1 && sizes.size(1) <= kMaxItemDims, "items must have 1 to ", kMaxItemDims,
                    " dimensions, got sizes with ", sizes.size(1), " columns");
  TORCH_CHECK_VALUE(sizes.device() == offsets.device(), "sizes must be on the offsets' device (", offsets.device(),
                    "), got ", sizes.device());
}

DenseSlot make_slot(c10::IntArrayRef shape) {
  DenseSlot slot{};
  slot.dims = static_cast<int>(shape.size());
  slot.numel = 1;
  for (int d = slot.dims - 1; d >= 0; --d) {
    slot.extent[d] = shape[d];
    slot.stride[d] = slot.numel;
    slot.numel *= shape[d];
  }
  return slot;
}

}  // namespace

PaddingArgs prepare_to_padded(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                              c10::IntArrayRef max_shape, bool validate_contents) {
  PaddingArgs a;
  check_values_and_offsets(values, offsets);
  check_sizes_tensor(sizes, offsets);
  dispatch_copy_dtype(values.scalar_type(), [](auto) {});
  TORCH_CHECK_VALUE(static_cast<int64_t>(max_shape.size()) == sizes.size(1), "max_shape must have one extent per item ",
                    "dimension (", sizes.size(1), "), got ", format_shape(max_shape));
  for (int64_t e : max_shape) {
    TORCH_CHECK_VALUE(e >= 0, "max_shape must be non-negative, got ", format_shape(max_shape));
  }
  if (validate_contents) validate_layout(offsets, sizes, values.numel());
  a.values = values.contiguous();
  a.offsets = offsets.contiguous();
  a.sizes = sizes.contiguous();
  a.slot = make_slot(max_shape);
  std::vector<int64_t> shape{offsets.numel() - 1};
  shape.insert(shape.end(), max_shape.begin(), max_shape.end());
  a.out = at::empty(shape, values.options());
  return a;
}

PaddingArgs prepare_from_padded(const at::Tensor& padded, const at::Tensor& offsets, const at::Tensor& sizes,
                                int64_t num_values, c10::string_view strategy, int64_t block_elems,
                                bool validate_contents, bool check_fit) {
  PaddingArgs a;
  a.strategy = parse_strategy(strategy);
  a.block_elems = resolve_block_elems(block_elems);
  TORCH_CHECK_VALUE(num_values >= 0, "num_values must be non-negative, got ", num_values);
  check_offsets_tensor(offsets);
  TORCH_CHECK_VALUE(padded.device() == offsets.device(), "padded must be on the offsets' device (", offsets.device(),
                    "), got ", padded.device());
  check_sizes_tensor(sizes, offsets);
  dispatch_copy_dtype(padded.scalar_type(), [](auto) {});
  const int64_t m = offsets.numel() - 1;
  TORCH_CHECK_VALUE(padded.dim() == sizes.size(1) + 1 && padded.size(0) == m, "padded must have shape [num_items, ",
                    "*slot] with num_items = ", m, " and ", sizes.size(1), " slot dimensions, got ",
                    format_shape(padded.sizes()));
  if (validate_contents) validate_layout(offsets, sizes, num_values);
  if (check_fit) {
    const at::Tensor slot = at::tensor(padded.sizes().slice(1), at::kLong).to(sizes.device());
    const at::Tensor too_big = (sizes > slot).any(1).nonzero();
    if (too_big.numel() > 0) {
      const int64_t i = too_big[0][0].item<int64_t>();
      TORCH_CHECK_VALUE(false, "item ", i, " of shape ", format_item_shape(sizes, i), " does not fit padded's slot ",
                        format_shape(padded.sizes().slice(1)), " (", too_big.size(0),
                        too_big.size(0) == 1 ? " item does not)" : " items do not)");
    }
  }
  a.padded = padded.contiguous();
  a.offsets = offsets.contiguous();
  a.sizes = sizes.contiguous();
  a.slot = make_slot(padded.sizes().slice(1));
  a.out = kernel_ready(at::empty({num_values}, padded.options()));
  return a;
}

at::Tensor to_padded_cpu(const at::Tensor& values, const at::Tensor& offsets, const at::Tensor& sizes,
                         c10::IntArrayRef max_shape, double pad_value, bool validate) {
  (void)validate;  // the CPU always checks: O(M) next to the O(output) copy
  PaddingArgs a = prepare_to_padded(values, offsets, sizes, max_shape, /*validate_contents=*/true);
  const int64_t m = a.offsets.numel() - 1;
  const DenseSlot& slot = a.slot;
  if (a.out.numel() == 0) return a.out;
  const int64_t width = slot.extent[slot.dims - 1];
  const int64_t rows_per_item = slot.numel / width;
  const int64_t* off = a.offsets.data_ptr<int64_t>();
  const int64_t* sz = a.sizes.data_ptr<int64_t>();
  dispatch_copy_dtype(a.values.scalar_type(), [&](auto tag) {
    using T = decltype(tag);
    const T* in = a.values.data_ptr<T>();
    T* out = a.out.data_ptr<T>();
    const T pad = static_cast<T>(pad_value);
    at::parallel_for(0, m * rows_per_item, 256, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        const int64_t i = row / rows_per_item;
        int64_t r = row % rows_per_item, src = off[i], inside = 1;
        int64_t item_stride = sz[i * slot.dims + slot.dims - 1];
        for (int d = slot.dims - 2; d >= 0; --d) {  // the row's coordinates, last leading dimension first
          const int64_t c = r % slot.extent[d];
          r /= slot.extent[d];
          inside &= c < sz[i * slot.dims + d];
          src += c * item_stride;
          item_stride *= sz[i * slot.dims + d];
        }
        const int64_t valid = inside ? std::min(width, sz[i * slot.dims + slot.dims - 1]) : 0;
        T* dst = out + row * width;
        for (int64_t x = 0; x < valid; ++x) dst[x] = in[src + x];
        for (int64_t x = valid; x < width; ++x) dst[x] = pad;
      }
    });
  });
  return a.out;
}

}  // namespace octopus
