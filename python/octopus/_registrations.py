"""Fake (meta) implementations and autograd formulas of the native ops, so that they
trace under ``torch.compile(fullgraph=True)`` and differentiate."""

import functools
import inspect

import torch

from . import _library  # noqa: F401


def _register_fake(op):
    """``torch.library.register_fake(op)`` with the real kernels' device check in front: every
    tensor argument on the device of the first. A parameter on another device (a ``meta``
    ``scale`` beside a CPU batch, say) sends the call here, to the fake, which would otherwise
    return an uninitialized tensor on the batch's device."""
    def register(fake):
        signature = inspect.signature(fake)

        @functools.wraps(fake)
        def checked(*args, **kwargs):
            tensors = [(name, value) for name, value in signature.bind(*args, **kwargs).arguments.items()
                       if isinstance(value, torch.Tensor)]
            first_name, first = tensors[0]
            for name, value in tensors[1:]:
                if value.device != first.device:
                    raise ValueError(f"{name} must be on the device of {first_name} ({first.device}), "
                                     f"got {value.device}")
            return fake(*args, **kwargs)

        torch.library.register_fake(op)(checked)
        return fake
    return register


def _out_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype == torch.uint8 else dtype


@_register_fake("octopus::affine")
def _affine_fake(values, offsets, scale, bias, strategy="plan", block_elems=0, metadata=None, validate=True):
    torch._check(values.dim() == 1, lambda: "values must be 1-D")
    torch._check(scale.shape[0] == offsets.shape[0] - 1, lambda: "scale must have num_items rows")
    torch._check(bias.shape == scale.shape, lambda: "bias must have the same shape as scale")
    return values.new_empty(values.shape, dtype=_out_dtype(values.dtype))


@_register_fake("octopus::plan")
def _plan_fake(offsets, num_values, block_elems):
    return offsets.new_empty((num_values // block_elems + offsets.shape[0], 2))


@_register_fake("octopus::lookup_table")
def _lookup_table_fake(offsets, num_values):
    return offsets.new_empty((num_values,), dtype=torch.int32)


@_register_fake("octopus::validate_layout")
def _validate_layout_fake(offsets, sizes, num_values):
    return None


def item_sums(data: torch.Tensor, offsets: torch.Tensor, channels: int) -> torch.Tensor:
    """Sum of ``data`` over each item (``[M]``), or over each of an item's ``channels``
    equal contiguous planes (``[M, C]``)."""
    m = offsets.shape[0] - 1
    if channels == 0:
        return torch.segment_reduce(data, "sum", offsets=offsets, unsafe=True)
    plane = offsets.diff() // channels
    starts = offsets[:-1, None] + torch.arange(channels, device=offsets.device) * plane[:, None]
    plane_offsets = torch.cat([starts.reshape(-1), offsets[-1:]])
    return torch.segment_reduce(data, "sum", offsets=plane_offsets, unsafe=True).view(m, channels)


def _affine_setup_context(ctx, inputs, output):
    values, offsets, scale, bias, strategy, block_elems, metadata, validate = inputs
    ctx.strategy, ctx.block_elems = strategy, block_elems
    ctx.channels = scale.shape[1] if scale.dim() == 2 else 0
    ctx.save_for_backward(values if ctx.needs_input_grad[2] else None, offsets, scale, metadata)


def _affine_backward(ctx, grad):
    values, offsets, scale, metadata = ctx.saved_tensors
    grad_values = grad_scale = grad_bias = None
    if ctx.needs_input_grad[0]:
        # d(out)/d(values) is the item's scale: the same op with zero bias.
        grad_values = torch.ops.octopus.affine(grad.contiguous(), offsets, scale, torch.zeros_like(scale),
                                               ctx.strategy, ctx.block_elems, metadata, False)
    acc = scale.dtype
    if ctx.needs_input_grad[2]:
        grad_scale = item_sums(grad.to(acc) * values.to(acc), offsets, ctx.channels)
    if ctx.needs_input_grad[3]:
        grad_bias = item_sums(grad.to(acc), offsets, ctx.channels)
    return grad_values, None, grad_scale, grad_bias, None, None, None, None


torch.library.register_autograd("octopus::affine", _affine_backward, setup_context=_affine_setup_context)


@_register_fake("octopus::sampler_step")
def _sampler_step_fake(model_output, sample, offsets, timesteps, schedules, tables, row_info, row_scalars,
                       sample_rows=None, noise=None, state=None, return_x0=False, strategy="block_search",
                       metadata=None):
    torch._check(model_output.shape == sample.shape, lambda: "model_output must have the sample's shape")
    torch._check(timesteps.shape[0] == offsets.shape[0] - 1, lambda: "timesteps must have one entry per sample")
    return torch.empty_like(sample), sample.new_empty((sample.shape[0] if return_x0 else 0,))


@_register_fake("octopus::to_padded")
def _to_padded_fake(values, offsets, sizes, max_shape, pad_value=0.0, validate=True):
    torch._check(len(max_shape) == sizes.shape[1], lambda: "max_shape must have one extent per item dimension")
    return values.new_empty((offsets.shape[0] - 1, *max_shape))


@_register_fake("octopus::from_padded")
def _from_padded_fake(padded, offsets, sizes, num_values, strategy="plan", block_elems=0, metadata=None,
                      validate=True):
    torch._check(padded.shape[0] == offsets.shape[0] - 1, lambda: "padded must have num_items rows")
    return padded.new_empty((num_values,))


def _to_padded_setup_context(ctx, inputs, output):
    values, offsets, sizes = inputs[:3]
    ctx.num_values = values.shape[0]
    ctx.save_for_backward(offsets, sizes)


def _to_padded_backward(ctx, grad):
    offsets, sizes = ctx.saved_tensors
    # Elements cropped away by max_shape get zero gradient (from_padded reads them as 0).
    grad_values = torch.ops.octopus.from_padded(grad.contiguous(), offsets, sizes, ctx.num_values, "block_search",
                                                0, None, False)
    return grad_values, None, None, None, None, None


torch.library.register_autograd("octopus::to_padded", _to_padded_backward, setup_context=_to_padded_setup_context)


def _from_padded_setup_context(ctx, inputs, output):
    padded, offsets, sizes = inputs[:3]
    ctx.slot = list(padded.shape[1:])
    ctx.save_for_backward(offsets, sizes)


def _from_padded_backward(ctx, grad):
    offsets, sizes = ctx.saved_tensors
    grad_padded = torch.ops.octopus.to_padded(grad.contiguous(), offsets, sizes, ctx.slot, 0.0, False)
    return grad_padded, None, None, None, None, None, None, None


torch.library.register_autograd("octopus::from_padded", _from_padded_backward,
                                setup_context=_from_padded_setup_context)


@_register_fake("octopus::item_stats")
def _item_stats_fake(values, offsets, channels=0, block_elems=0, plan=None, validate=True):
    return values.new_empty((offsets.shape[0] - 1, max(channels, 1), 4), dtype=torch.float64)


def _item_stats_setup_context(ctx, inputs, output):
    values, offsets, channels = inputs[:3]
    ctx.channels = channels
    ctx.save_for_backward(values, offsets, output)


def _item_stats_backward(ctx, grad):
    # d sum / dx = 1 and d M2 / dx = 2 (x - mean) within the element's (item, channel): the
    # gradient is x * (2 g_M2) + (g_sum - 2 g_M2 mean), an affine op. min and max have none.
    values, offsets, stats = ctx.saved_tensors
    planes = stats.shape[1]
    count = (offsets.diff() // planes).to(torch.float64).clamp_min(1).unsqueeze(1)
    g_sum, g_m2 = grad[..., 0], grad[..., 1]
    mean = stats[..., 0] / count
    acc = torch.float64 if values.dtype == torch.float64 else torch.float32
    scale = (2 * g_m2).to(acc)
    bias = torch.nan_to_num(g_sum - 2 * g_m2 * mean).to(acc)
    if ctx.channels == 0:
        scale, bias = scale[:, 0], bias[:, 0]
    grad_values = torch.ops.octopus.affine(values, offsets, scale.contiguous(), bias.contiguous(), "block_search", 0,
                                           None, False)
    return grad_values.to(values.dtype), None, None, None, None, None


torch.library.register_autograd("octopus::item_stats", _item_stats_backward, setup_context=_item_stats_setup_context)


@_register_fake("octopus::pointwise")
def _pointwise_fake(values, offsets, kind, a, b, strategy="plan", block_elems=0, metadata=None, validate=True):
    torch._check(values.dim() == 1, lambda: "values must be 1-D")
    torch._check(a.shape[0] == offsets.shape[0] - 1, lambda: "a must have num_items rows")
    torch._check(b.shape == a.shape, lambda: "b must have the same shape as a")
    return values.new_empty(values.shape, dtype=_out_dtype(values.dtype))


def _pointwise_setup_context(ctx, inputs, output):
    values, offsets, kind, a, b, strategy, block_elems, metadata, validate = inputs
    ctx.kind, ctx.strategy, ctx.block_elems = kind, strategy, block_elems
    ctx.save_for_backward(values, offsets, a, b, metadata)


def _pointwise_backward(ctx, grad):
    """The values' gradient, from the same op: clamp passes it where lo <= x <= hi,
    threshold "keep" where x > t, power scales it by a * b * x^(a - 1); the masks have none.
    The parameters get no gradient, except center_scale's (normalization's mean and scale)."""
    values, offsets, a, b, metadata = ctx.saved_tensors
    if ctx.kind == "center_scale":
        return _center_scale_backward(ctx, grad, values, offsets, a, b, metadata)

    def same_op(kind, p, q):
        return torch.ops.octopus.pointwise(values, offsets, kind, p, q, ctx.strategy, ctx.block_elems, metadata, False)

    if ctx.kind == "clamp":
        local = same_op("inside", a, b)
    elif ctx.kind == "threshold_keep":
        local = same_op("threshold_mask", a, b)
    elif ctx.kind == "power":
        local = same_op("power", a - 1, a * b)
    else:
        local = torch.zeros_like(grad)
    return (grad * local).to(values.dtype), None, None, None, None, None, None, None, None


def _center_scale_backward(ctx, grad, values, offsets, a, b, metadata):
    """out = (x - a) * b with a and b constant over an item (or its channel): d/dx = b,
    d/da = -b * sum(grad), d/db = sum(grad * x) - a * sum(grad) over the item (channel)."""
    grad_values = grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_values = torch.ops.octopus.pointwise(grad.contiguous(), offsets, "center_scale", torch.zeros_like(a), b,
                                                  ctx.strategy, ctx.block_elems, metadata, False).to(values.dtype)
    if ctx.needs_input_grad[3] or ctx.needs_input_grad[4]:
        channels = a.shape[1] if a.dim() == 2 else 0
        acc = a.dtype
        sum_grad = item_sums(grad.to(acc), offsets, channels)
        if ctx.needs_input_grad[3]:
            grad_a = -b * sum_grad
        if ctx.needs_input_grad[4]:
            grad_b = item_sums(grad.to(acc) * values.to(acc), offsets, channels) - a * sum_grad
    return grad_values, None, None, grad_a, grad_b, None, None, None, None


torch.library.register_autograd("octopus::pointwise", _pointwise_backward, setup_context=_pointwise_setup_context)


@_register_fake("octopus::crop_resize")
def _crop_resize_fake(values, offsets, sizes, boxes, channels, out_h, out_w, scale=1.0, mean=None, std=None,
                      validate=True):
    torch._check(boxes.dim() == 2 and boxes.shape[1] == 5, lambda: "boxes must be [K, 5]")
    return values.new_empty((boxes.shape[0], channels, out_h, out_w), dtype=_out_dtype(values.dtype))


@_register_fake("octopus::crop_resize_backward")
def _crop_resize_backward_fake(grad, values, offsets, sizes, boxes, scale=1.0, std=None):
    return torch.empty_like(values)


def _crop_resize_setup_context(ctx, inputs, output):
    values, offsets, sizes, boxes, channels, out_h, out_w, scale, mean, std, validate = inputs
    ctx.scale = scale
    ctx.save_for_backward(values, offsets, sizes, boxes, std)


def _crop_resize_backward(ctx, grad):
    values, offsets, sizes, boxes, std = ctx.saved_tensors
    grad_values = torch.ops.octopus.crop_resize_backward(grad.contiguous(), values, offsets, sizes, boxes, ctx.scale,
                                                         std)
    return grad_values, None, None, None, None, None, None, None, None, None, None


torch.library.register_autograd("octopus::crop_resize", _crop_resize_backward, setup_context=_crop_resize_setup_context)


@_register_fake("octopus::stencil3x3")
def _stencil3x3_fake(values, offsets, sizes, weight, border="replicate", strategy="plan", block_elems=0,
                     metadata=None, validate=True):
    torch._check(weight.dim() == 2 and weight.shape[1] == 9, lambda: "weight must be [channels, 9]")
    return values.new_empty(values.shape, dtype=_out_dtype(values.dtype))


@_register_fake("octopus::stencil3x3_backward")
def _stencil3x3_backward_fake(grad, offsets, sizes, weight, border="replicate", strategy="plan", block_elems=0,
                              metadata=None, validate=True):
    return torch.empty_like(grad)


def _stencil3x3_setup_context(ctx, inputs, output):
    values, offsets, sizes, weight, border, strategy, block_elems, metadata, validate = inputs
    ctx.border, ctx.strategy, ctx.block_elems = border, strategy, block_elems
    ctx.save_for_backward(values if ctx.needs_input_grad[3] else None, offsets, sizes, weight, metadata)


def _stencil3x3_backward(ctx, grad):
    """The values' gradient is the adjoint stencil (replicated borders send the gradient of
    every tap that read an edge pixel back to it). The weight's: tap t of channel c gathers
    sum(grad * input shifted by t) over that channel of every item — the forward op with a
    one-hot kernel, then per-(item, channel) sums."""
    values, offsets, sizes, weight, metadata = ctx.saved_tensors
    grad = grad.to(weight.dtype).contiguous()
    grad_values = grad_weight = None
    if ctx.needs_input_grad[0]:
        grad_values = torch.ops.octopus.stencil3x3_backward(grad, offsets, sizes, weight, ctx.border, ctx.strategy,
                                                            ctx.block_elems, metadata, False)
    if ctx.needs_input_grad[3]:
        channels = weight.shape[0]
        taps = []
        for t in range(9):
            one_hot = torch.zeros_like(weight)
            one_hot[:, t] = 1
            shifted = torch.ops.octopus.stencil3x3(values, offsets, sizes, one_hot, ctx.border, ctx.strategy,
                                                   ctx.block_elems, metadata, False)
            taps.append(item_sums(shifted.to(weight.dtype) * grad, offsets, channels).sum(0))
        grad_weight = torch.stack(taps, dim=1)
    return grad_values, None, None, grad_weight, None, None, None, None, None


torch.library.register_autograd("octopus::stencil3x3", _stencil3x3_backward, setup_context=_stencil3x3_setup_context)


@_register_fake("octopus::crop_resize_ragged")
def _crop_resize_ragged_fake(values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values,
                             scale=1.0, mean=None, std=None, strategy="plan", block_elems=0, metadata=None,
                             validate=True):
    torch._check(out_offsets.shape[0] == boxes.shape[0] + 1, lambda: "out_offsets must have num_boxes + 1 entries")
    return values.new_empty((num_out_values,), dtype=_out_dtype(values.dtype))


@_register_fake("octopus::crop_resize_ragged_backward")
def _crop_resize_ragged_backward_fake(grad, values, offsets, sizes, boxes, channels, out_offsets, out_sizes,
                                      scale=1.0, std=None):
    return torch.empty_like(values)


def _crop_resize_ragged_setup_context(ctx, inputs, output):
    (values, offsets, sizes, boxes, channels, out_offsets, out_sizes, num_out_values, scale, mean, std, strategy,
     block_elems, metadata, validate) = inputs
    ctx.channels, ctx.scale = channels, scale
    ctx.save_for_backward(values, offsets, sizes, boxes, out_offsets, out_sizes, std)


def _crop_resize_ragged_backward(ctx, grad):
    values, offsets, sizes, boxes, out_offsets, out_sizes, std = ctx.saved_tensors
    grad_values = torch.ops.octopus.crop_resize_ragged_backward(grad.contiguous(), values, offsets, sizes, boxes,
                                                                ctx.channels, out_offsets, out_sizes, ctx.scale, std)
    return (grad_values,) + (None,) * 14


torch.library.register_autograd("octopus::crop_resize_ragged", _crop_resize_ragged_backward,
                                setup_context=_crop_resize_ragged_setup_context)


@_register_fake("octopus::tile_stats")
def _tile_stats_fake(image, tiles, threshold, min_mean, max_mean, min_fraction, max_fraction, validate=True):
    t = tiles.shape[0]
    return (image.new_empty((t,), dtype=torch.float64), image.new_empty((t,), dtype=torch.float64),
            image.new_empty((t,), dtype=torch.bool))
