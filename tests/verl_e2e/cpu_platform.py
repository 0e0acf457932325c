"""A ``cpu`` VERL platform, registered through VERL's own ``PlatformRegistry`` (no VERL file edited).

VERL 0.9 routes every device call through ``verl.plugin.platform.get_platform()``; selecting this
class with ``VERL_PLATFORM=cpu`` makes FSDP run on CPU tensors with the ``gloo`` backend.
Ray scheduling still asks for the ``GPU`` resource (VERL's resource-pool check only looks at
``GPU``/``NPU``), so the test starts Ray with fake GPUs (``ray_init.num_gpus``); torch never sees
them.

One shim is not an extension point: VERL 0.9.1 always asks torch for the backend string
``"cpu:gloo,{device}:{backend}"``, which torch rejects when the device is ``cpu``
("Duplicate device type cpu"). :func:`_dedupe_backend` collapses repeated identical
``device:backend`` pairs before ``torch.distributed.init_process_group`` sees them.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

_CPU = torch.device("cpu")


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _zero(*_args: Any, **_kwargs: Any) -> int:
    return 0


def _device_module() -> types.SimpleNamespace:
    """The ``torch.<device>``-like namespace VERL calls (``empty_cache``, ``mem_get_info``, ...)."""
    return types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 1,
        current_device=lambda: _CPU,
        set_device=_noop,
        synchronize=_noop,
        empty_cache=_noop,
        ipc_collect=_noop,
        set_per_process_memory_fraction=_noop,
        memory_allocated=_zero,
        memory_reserved=_zero,
        max_memory_allocated=_zero,
        max_memory_reserved=_zero,
        reset_peak_memory_stats=_noop,
        mem_get_info=lambda *_a: (8 << 30, 16 << 30),
        get_device_name=lambda *_a: "cpu",
        get_rng_state=lambda *_a: torch.get_rng_state(),
        set_rng_state=lambda state, *_a: torch.set_rng_state(state),
        manual_seed=torch.manual_seed,
        manual_seed_all=torch.manual_seed,
        Stream=torch.cpu.Stream,
        Event=torch.Event,
        stream=torch.cpu.stream,
        current_stream=torch.cpu.current_stream,
    )


def _dedupe_backend() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_cpu_platform_shim", False):
        return

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend")
        if isinstance(backend, str) and "," in backend:
            parts = list(dict.fromkeys(p.strip() for p in backend.split(",")))
            kwargs["backend"] = ",".join(parts)
        return original(*args, **kwargs)

    init_process_group._cpu_platform_shim = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


_dedupe_backend()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """CPU tensors, gloo collectives, no profiling ranges of its own."""

    _module = _device_module()

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> Any:
        return self._module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return True

    def current_device(self) -> Any:
        # VERL passes this to FSDP's device_id and to tensor.to(...): an int would mean cuda:N.
        return _CPU

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextmanager
    def nvtx_range(self, msg: str):  # type: ignore[no-untyped-def]
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_gpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
