"""Which trace events are GPU work, which CPU events launch it, and what kind of work it is.

GPU work is what Kineto records per CUDA (or HIP, MTIA) stream: category ``kernel``, ``gpu_memcpy``,
``gpu_memset`` (older exports: ``Kernel``, ``Memcpy``, ``Memset``; MTIA: ``mtia_ccp_events``) WITH an
integer ``args.stream`` — HTA's own selection (``stream != -1``). Proton's kernel lanes carry no
stream and no launch id, and ``gpu_user_annotation`` spans kernels rather than running beside
them: neither is counted. Launches are the CPU-side runtime/driver calls (``cuda_runtime``,
``cuda_driver``): Kineto gives the call and its kernels the same ``args.correlation``.

Kinds (HTA 0.5 ``get_kernel_type``, plus the collective libraries it does not know):

- ``comm``: a name starting ``nccl…Kernel`` (NCCL, RCCL), or a collective kernel of vLLM's custom
  all-reduce, NVSHMEM or DeepEP;
- ``memory``: a name starting ``Memcpy``, ``Memset`` or ``dma``, or a memcpy/memset category;
- ``compute``: everything else. HTA also has ``OTHER`` (names containing ``Sync``, or ``Memcpy`` /
  ``Memset`` not at the start); no kernel of the real traces in shared/ is one, and here they
  count as compute (``memory`` when the name has Memcpy/Memset in it).
"""

from __future__ import annotations

import functools
import re

__all__ = ["COMM", "COMPUTE", "GPU_CATEGORIES", "KINDS", "LAUNCH_CATEGORIES", "MEMORY", "kind_of"]

COMPUTE, COMM, MEMORY = "compute", "comm", "memory"
KINDS = (COMPUTE, COMM, MEMORY)
GPU_CATEGORIES = frozenset(
    {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "mtia_ccp_events"}
)
MEMORY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset", "Memcpy", "Memset"})
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "Driver", "mtia_runtime"})

_HTA_COMM = re.compile(r"^nccl.*Kernel")
_OTHER_COMM = re.compile(
    r"cross_device_reduce|(one|two)_shot_all_reduce|nvshmem|deep_ep::|^rccl|ncclDevKernel", re.IGNORECASE
)
_HTA_MEMORY = re.compile(r"^(Memcpy|Memset|dma)")
_EMBEDDED_MEMORY = re.compile(r"Memcpy|Memset")


@functools.lru_cache(maxsize=65536)
def kind_of(name: str, category: str = "kernel") -> str:
    """``compute``, ``comm`` or ``memory`` for one GPU event (see the module docstring)."""
    if _HTA_COMM.match(name) or _OTHER_COMM.search(name):
        return COMM
    if category in MEMORY_CATEGORIES or _HTA_MEMORY.match(name) or _EMBEDDED_MEMORY.search(name):
        return MEMORY
    return COMPUTE
