"""GPU energy from NVML's total-energy counter (millijoules since the driver loaded), read
through ctypes so that no Python NVML package is needed. Volta and newer data-center GPUs
expose the counter; elsewhere :class:`EnergyCounter` reports itself unavailable."""

from __future__ import annotations

import ctypes
from typing import Optional, cast

import torch


def nvml_device(device: torch.device) -> tuple[Optional[ctypes.CDLL], Optional[ctypes.c_void_p], str]:
    """(the NVML library, the handle of the GPU behind a torch CUDA device, "") or (None, None,
    why not)."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as err:
        return None, None, f"NVML not found ({err})"
    if nvml.nvmlInit_v2() != 0:
        return None, None, "nvmlInit failed"
    handle = ctypes.c_void_p()
    props = torch.cuda.get_device_properties(device)
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:  # map by PCI address: NVML ignores CUDA_VISIBLE_DEVICES
        address = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        rc = nvml.nvmlDeviceGetHandleByPciBusId_v2(address.encode(), ctypes.byref(handle))
    else:
        rc = nvml.nvmlDeviceGetHandleByIndex_v2(device.index or 0, ctypes.byref(handle))
    if rc != 0:
        return None, None, f"no NVML handle for the device (error {rc})"
    return nvml, handle, ""


class EnergyCounter:
    """The total-energy counter of the GPU behind a torch CUDA device."""

    def __init__(self, device: torch.device):
        self.available = False
        self._nvml, self._handle, self.reason = nvml_device(device)
        if self._nvml is None:
            return
        if self.millijoules() is None:
            self.reason = "the GPU does not expose a total-energy counter"
            return
        self.available = True

    def millijoules(self) -> Optional[int]:
        value = ctypes.c_ulonglong()
        nvml = cast(ctypes.CDLL, self._nvml)  # called where NVML was found
        if nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(value)) != 0:
            return None
        return value.value


def driver_version() -> Optional[str]:
    """The NVIDIA driver version, where NVML can be loaded."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        if nvml.nvmlInit_v2() != 0:
            return None
        buf = ctypes.create_string_buffer(96)
        return buf.value.decode() if nvml.nvmlSystemGetDriverVersion(buf, 96) == 0 else None
    except OSError:
        return None
