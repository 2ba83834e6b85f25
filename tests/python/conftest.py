import pytest
import torch

import octopus

HAS_CUDA = torch.cuda.is_available() and octopus.built_with_cuda

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA device and a CUDA build of octopus")])]


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def random_batch(sizes, device, dtype=torch.float32, channels=None, seed=0, item_dim=None):
    """A RaggedBatch of random items; `sizes` are item shapes (`item_dim` says their number of
    dimensions where `sizes` may be empty)."""
    g = torch.Generator().manual_seed(seed)
    items = []
    for shape in sizes:
        if dtype == torch.uint8:
            items.append(torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))
        else:
            items.append(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype))
    return octopus.RaggedBatch.from_tensors(items, device=device, dtype=dtype, item_dim=item_dim or (len(sizes[0]) if sizes else 1))
