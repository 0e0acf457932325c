"""A stand-in for ``pynvml`` (nvidia-ml-py) on machines without an NVIDIA GPU — a FAKE, on purpose.

It has nvidia-ml-py's function names, call signatures, return shapes (structs with the same field
names; busId/UUID/name as nvidia-ml-py 12+ returns them) and error types (``NVMLError`` whose
``NVMLError(code)`` builds the per-code subclass, e.g. ``NVMLError_NotSupported``, carrying
``.value``), for the calls the sampler makes. Devices are configured by the test
(:func:`configure`); no value here is a measurement. The real library is exercised on a GPU by
``scripts/gpu/metrics_sampler_check.sh``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_CLOCK_SM = 1
NVML_GPM_METRIC_SM_UTIL = 2
NVML_GPM_METRIC_SM_OCCUPANCY = 3
NVML_GPM_METRIC_ANY_TENSOR_UTIL = 5
NVML_GPM_METRIC_DRAM_BW_UTIL = 10
NVML_GPM_METRICS_GET_VERSION = 1
NVML_GPM_METRIC_MAX = 477


class NVMLError(Exception):
    _valClassMapping: ClassVar[dict[int, type]] = {}

    def __new__(cls, value: int) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value  # type: ignore[attr-defined]
        return obj

    def __init__(self, value: int) -> None:
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
            NVML_ERROR_UNINITIALIZED: "Uninitialized",
        }.get(self.value, f"NVML Error with code {self.value}")


def _subclass(name: str, code: int) -> type:
    cls = type(name, (NVMLError,), {"__new__": lambda c, *a: NVMLError.__new__(c, code)})
    NVMLError._valClassMapping[code] = cls
    return cls


NVMLError_NotSupported = _subclass("NVMLError_NotSupported", NVML_ERROR_NOT_SUPPORTED)
NVMLError_LibraryNotFound = _subclass("NVMLError_LibraryNotFound", NVML_ERROR_LIBRARY_NOT_FOUND)
NVMLError_Uninitialized = _subclass("NVMLError_Uninitialized", NVML_ERROR_UNINITIALIZED)


@dataclass
class c_nvmlUtilization_t:
    gpu: int = 0
    memory: int = 0


@dataclass
class c_nvmlMemory_t:
    total: int = 0
    free: int = 0
    used: int = 0


@dataclass
class nvmlPciInfo_t:
    busId: str = ""


@dataclass
class c_nvmlGpmSupport_t:
    version: int = 1
    isSupportedDevice: int = 0


@dataclass
class c_nvmlGpmMetric_t:
    metricId: int = 0
    nvmlReturn: int = 0
    value: float = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(NVML_GPM_METRIC_MAX)]


@dataclass
class FakeGpu:
    """What the test says device ``index`` reports."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:07:00.0"
    util: int = 0
    mem_util: int = 0
    used: int = 0
    total: int = 80 << 30
    power_mw: int | None = 100_000  # None: NotSupported
    sm_clock: int = 1980
    gpm: dict[int, float] | None = None  # metric id -> value; None: no GPM
    calls: dict[str, int] = field(default_factory=dict)


_devices: list[FakeGpu] = []
_state = {"init": False, "missing": False}


def configure(devices: list[FakeGpu], *, missing_library: bool = False) -> None:
    _devices[:] = devices
    _state.update(init=False, missing=missing_library)


def _dev(handle: Any) -> FakeGpu:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    d = _devices[handle]
    return d


def nvmlInit() -> None:
    if _state["missing"]:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _state["init"] = True


def nvmlShutdown() -> None:
    _state["init"] = False


def nvmlDeviceGetCount() -> int:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return len(_devices)


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _dev(index)
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return _dev(handle).name


def nvmlDeviceGetUUID(handle: int) -> str:
    return _dev(handle).uuid


def nvmlDeviceGetPciInfo(handle: int) -> nvmlPciInfo_t:
    return nvmlPciInfo_t(_dev(handle).bus_id)


def nvmlDeviceGetUtilizationRates(handle: int) -> c_nvmlUtilization_t:
    d = _dev(handle)
    return c_nvmlUtilization_t(d.util, d.mem_util)


def nvmlDeviceGetMemoryInfo(handle: int, version: int | None = None) -> c_nvmlMemory_t:
    d = _dev(handle)
    return c_nvmlMemory_t(d.total, d.total - d.used, d.used)


def nvmlDeviceGetPowerUsage(handle: int) -> int:
    d = _dev(handle)
    d.calls["power"] = d.calls.get("power", 0) + 1
    if d.power_mw is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return d.power_mw


def nvmlDeviceGetClockInfo(handle: int, type: int) -> int:
    assert type == NVML_CLOCK_SM
    return _dev(handle).sm_clock


def nvmlGpmQueryDeviceSupport(device: int) -> c_nvmlGpmSupport_t:
    return c_nvmlGpmSupport_t(1, int(_dev(device).gpm is not None))


def nvmlGpmSampleAlloc() -> list[Any]:
    return [None]


def nvmlGpmSampleFree(sample: Any) -> None:
    return None


def nvmlGpmSampleGet(device: int, sample: list[Any]) -> list[Any]:
    sample[0] = device
    return sample


def nvmlGpmMetricsGet(request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
    assert request.version == NVML_GPM_METRICS_GET_VERSION
    device = _dev(request.sample2[0])
    assert device.gpm is not None and request.sample1[0] == request.sample2[0]
    for m in request.metrics[: request.numMetrics]:
        if m.metricId in device.gpm:
            m.value, m.nvmlReturn = device.gpm[m.metricId], NVML_SUCCESS
        else:
            m.nvmlReturn = NVML_ERROR_NOT_SUPPORTED
    return request
