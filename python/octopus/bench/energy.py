"""GPU energy from NVML's total-energy counter (millijoules since the driver loaded), read
through ctypes so that no Python NVML package is needed. Volta and newer data-center GPUs
expose the counter; elsewhere :class:`EnergyCounter` reports itself unavailable."""

from __future__ import annotations

import ctypes
from typing import Optional

import torch


class EnergyCounter:
    """The total-energy counter of the GPU behind a torch CUDA device."""

    def __init__(self, device: torch.device):
        self.available = False
        self.reason = ""
        try:
            self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        except OSError as err:
            self.reason = f"NVML not found ({err})"
            return
        if self._nvml.nvmlInit_v2() != 0:
            self.reason = "nvmlInit failed"
            return
        self._handle = ctypes.c_void_p()
        props = torch.cuda.get_device_properties(device)
        bus = getattr(props, "pci_bus_id", None)
        if bus is not None:  # map by PCI address: NVML ignores CUDA_VISIBLE_DEVICES
            address = f"{getattr(props, 'pci_domain_id', 0):08x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
            rc = self._nvml.nvmlDeviceGetHandleByPciBusId_v2(address.encode(), ctypes.byref(self._handle))
        else:
            rc = self._nvml.nvmlDeviceGetHandleByIndex_v2(device.index or 0, ctypes.byref(self._handle))
        if rc != 0:
            self.reason = f"no NVML handle for the device (error {rc})"
            return
        if self.millijoules() is None:
            self.reason = "the GPU does not expose a total-energy counter"
            return
        self.available = True

    def millijoules(self) -> Optional[int]:
        value = ctypes.c_ulonglong()
        if self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle, ctypes.byref(value)) != 0:
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
