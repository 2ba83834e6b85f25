"""GPU readings from NVML, through ctypes so that no Python NVML package is needed: the
total-energy counter (millijoules since the driver loaded; Volta and newer data-center GPUs
expose it, elsewhere :class:`EnergyCounter` reports itself unavailable), and utilization,
SM clock and power sampled over a window (:class:`GpuSampler`)."""

from __future__ import annotations

import ctypes
import statistics
import threading
from typing import Dict, List, Optional, cast

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


NVML_CLOCK_SM = 1
NVML_CLOCK_REASON_SW_POWER_CAP = 0x4


class GpuSampler:
    """NVML readings of the GPU behind a torch device, sampled every ``period`` s on a thread
    while in a ``with`` block: ``utilization`` (percent of time a kernel ran), ``sm_clock_mhz``,
    ``power_w``, and ``power_capped`` (1 where the driver held the clock down for the power
    cap, else 0). :meth:`mean` is None for a reading NVML does not give (or without NVML)."""

    FIELDS = ("utilization", "sm_clock_mhz", "power_w", "power_capped")

    def __init__(self, device: torch.device, period: float = 0.05):
        self._nvml = self._handle = None
        self._period = period
        if device.type == "cuda":
            self._nvml, self._handle, _ = nvml_device(device)
        self._reasons = None
        if self._nvml is not None:
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
                try:  # the newer name first (drivers since 535), the deprecated one where it is all there is
                    self._reasons = getattr(self._nvml, name)
                    break
                except AttributeError:
                    continue
        self.samples: Dict[str, List[float]] = {f: [] for f in self.FIELDS}

    def __enter__(self) -> "GpuSampler":
        self.samples = {f: [] for f in self.FIELDS}
        self._stop = threading.Event()
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            self._read()

    def _read(self) -> None:
        nvml, handle = cast(ctypes.CDLL, self._nvml), self._handle
        rates, value, reasons = (ctypes.c_uint * 2)(), ctypes.c_uint(), ctypes.c_ulonglong()
        if nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) == 0:
            self.samples["utilization"].append(float(rates[0]))
        if nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(value)) == 0:
            self.samples["sm_clock_mhz"].append(float(value.value))
        if nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(value)) == 0:
            self.samples["power_w"].append(value.value / 1e3)
        if self._reasons is not None and self._reasons(handle, ctypes.byref(reasons)) == 0:
            self.samples["power_capped"].append(float(bool(reasons.value & NVML_CLOCK_REASON_SW_POWER_CAP)))

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._nvml is not None:
            self._thread.join()

    def mean(self, field: str) -> Optional[float]:
        values = self.samples[field]
        return statistics.fmean(values) if values else None


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
