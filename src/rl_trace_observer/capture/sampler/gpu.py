"""The node's GPUs through NVML (``nvidia-ml-py``'s ``pynvml``), imported only in the sampler.

Per device and sample: utilisation (NVML's "a kernel ran" share of its last 1/6-1 s window —
not SM activity), memory-controller utilisation, memory used, power, SM clock; and, on GPUs with
GPM (Hopper and newer), SM activity, SM occupancy, tensor-pipe activity and DRAM bandwidth use over
the interval between two GPM samples. Every device is described once (index, PCI bus id, UUID,
name, memory total) so the merger can map it to each process's CUDA device through that process's
``CUDA_VISIBLE_DEVICES``. No NVML library, no driver or no device is one reason string, never an
error: the manifest then says no GPU was found.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

GAUGES = (  # series name, unit note for docs
    "gpu_utilization_percent",
    "gpu_memory_utilization_percent",
    "gpu_memory_used_bytes",
    "gpu_power_watts",
    "gpu_sm_clock_mhz",
)
GPM_METRICS = (  # (series name, pynvml constant name)
    ("gpu_sm_active_percent", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpu_sm_occupancy_percent", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpu_tensor_active_percent", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("gpu_dram_active_percent", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)


def cuda_index(visible: str | None, physical: int, uuid: str | None) -> int | None:
    """The CUDA device number under which a process with this ``CUDA_VISIBLE_DEVICES`` sees the GPU
    NVML calls ``physical`` (with ``uuid``); None when it does not see it.

    Unset: every GPU, numbered as NVML does (CUDA's default order equals PCI bus order on nodes of
    one GPU model; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes it so everywhere). Entries are indices or
    UUID prefixes (``GPU-8a1c…``); the list ends at the first entry that names nothing, as in CUDA.
    """
    if visible is None:
        return physical
    for position, entry in enumerate(e.strip() for e in visible.split(",")):
        if entry.isdigit():
            if int(entry) == physical:
                return position
        elif entry.startswith("GPU-") and uuid:
            if uuid.startswith(entry):
                return position
        else:
            return None  # MIG-… and anything unknown: CUDA stops reading the list here
    return None


def process_visible_devices(pid: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` of a process on this node, read from ``/proc``; None when unset."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith(b"CUDA_VISIBLE_DEVICES="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:
        return None
    return None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass
class Device:
    index: int
    handle: Any
    info: dict[str, Any]
    gpm: bool = False
    gpm_prev: Any = None
    gpm_next: Any = None
    failed: set[str] = field(default_factory=set)


class Gpus:
    """Opens NVML once; :meth:`sample` returns ``{device index: {series: value}}``."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.devices: list[Device] = []
        self.reason: str | None = None
        self._nvml: Any = nvml
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install 'rl-trace-observer[metrics]')"
            return
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...
            self.reason = f"NVML unavailable: {exc}"
            return
        try:
            count = int(self._nvml.nvmlDeviceGetCount())
        except Exception as exc:
            self.reason = f"NVML cannot count devices: {exc}"
            return
        for index in range(count):
            try:
                self.devices.append(self._open(index))
            except Exception as exc:
                self.reason = f"NVML cannot open device {index}: {exc}"
        if not self.devices and self.reason is None:
            self.reason = "NVML found no GPU"

    def _open(self, index: int) -> Device:
        nv = self._nvml
        handle = nv.nvmlDeviceGetHandleByIndex(index)
        info: dict[str, Any] = {"index": index}
        for key, call in (
            ("name", lambda: _text(nv.nvmlDeviceGetName(handle))),
            ("uuid", lambda: _text(nv.nvmlDeviceGetUUID(handle))),
            ("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(handle).busId)),
            ("memory_total_bytes", lambda: int(nv.nvmlDeviceGetMemoryInfo(handle).total)),
        ):
            try:
                info[key] = call()
            except Exception:
                info[key] = None
        device = Device(index, handle, info)
        try:
            device.gpm = bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
            if device.gpm:
                device.gpm_prev, device.gpm_next = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
                nv.nvmlGpmSampleGet(handle, device.gpm_prev)
        except Exception:
            device.gpm = False
        info["gpm"] = device.gpm
        return device

    def sample(self) -> dict[int, dict[str, float]]:
        out: dict[int, dict[str, float]] = {}
        for device in self.devices:
            values: dict[str, float] = {}
            self._basic(device, values)
            if device.gpm:
                self._gpm(device, values)
            out[device.index] = values
        return out

    def _basic(self, device: Device, values: dict[str, float]) -> None:
        nv, h = self._nvml, device.handle
        calls: tuple[tuple[str, Callable[..., Any], tuple[Any, ...]], ...] = (
            ("utilization", nv.nvmlDeviceGetUtilizationRates, (h,)),
            ("memory", nv.nvmlDeviceGetMemoryInfo, (h,)),
            ("power", nv.nvmlDeviceGetPowerUsage, (h,)),
            ("clock", nv.nvmlDeviceGetClockInfo, (h, nv.NVML_CLOCK_SM)),
        )
        for what, call, args in calls:
            if what in device.failed:
                continue
            try:
                result = call(*args)
            except Exception:  # NotSupported on this device (power on some boards): stop asking
                device.failed.add(what)
                continue
            if what == "utilization":
                values["gpu_utilization_percent"] = float(result.gpu)
                values["gpu_memory_utilization_percent"] = float(result.memory)
            elif what == "memory":
                values["gpu_memory_used_bytes"] = float(result.used)
            elif what == "power":
                values["gpu_power_watts"] = float(result) / 1000.0  # NVML reports milliwatts
            else:
                values["gpu_sm_clock_mhz"] = float(result)

    def _gpm(self, device: Device, values: dict[str, float]) -> None:
        nv = self._nvml
        try:
            nv.nvmlGpmSampleGet(device.handle, device.gpm_next)
            request = nv.c_nvmlGpmMetricsGet_t()
            request.version = nv.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1, request.sample2 = device.gpm_prev, device.gpm_next
            for i, (_, const) in enumerate(GPM_METRICS):
                request.metrics[i].metricId = getattr(nv, const)
            nv.nvmlGpmMetricsGet(request)
        except Exception:
            device.gpm = False  # one failure: GPM off for this device, the basic counters go on
            return
        for i, (series, _) in enumerate(GPM_METRICS):
            metric = request.metrics[i]
            if int(getattr(metric, "nvmlReturn", 0)) == 0:
                values[series] = float(metric.value)
        device.gpm_prev, device.gpm_next = device.gpm_next, device.gpm_prev

    def users(self) -> dict[int, list[tuple[int, int]]]:
        """Per device: the processes with a CUDA context on it, as ``(pid, their CUDA index)``.

        From ``nvmlDeviceGetComputeRunningProcesses`` and each process's ``CUDA_VISIBLE_DEVICES``;
        a pid NVML names from another pid namespace (a container) has no ``/proc`` entry here and is
        left out.
        """
        out: dict[int, list[tuple[int, int]]] = {}
        for device in self.devices:
            if "processes" in device.failed:
                continue
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(device.handle)
            except Exception:
                device.failed.add("processes")
                continue
            found = []
            for proc in procs:
                pid = int(proc.pid)
                if not os.path.exists(f"/proc/{pid}"):
                    continue
                index = cuda_index(process_visible_devices(pid), device.index, device.info.get("uuid"))
                if index is not None:
                    found.append((pid, index))
            out[device.index] = sorted(set(found))
        return out

    def close(self) -> None:
        nv = self._nvml
        if nv is None or not self.devices:
            return
        for device in self.devices:
            for sample in (device.gpm_prev, device.gpm_next):
                if sample is not None:
                    try:
                        nv.nvmlGpmSampleFree(sample)
                    except Exception:
                        pass
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
