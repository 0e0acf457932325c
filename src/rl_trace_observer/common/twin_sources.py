"""The one list of compiled twins: module name -> its Cython source, relative to the package root.

Dependency-free on purpose: ``setup.py`` reads this file before the package is installed (to build
each twin with the hash of its source compiled in) and :mod:`rl_trace_observer.common.twins` reads it
to judge, at import, whether a built twin still matches its source.
"""

TWINS: dict[str, str] = {
    "rl_trace_observer.merge.output._pftrace_native": "merge/output/_pftrace_native.pyx",
    "rl_trace_observer.merge.output._chrome_json_native": "merge/output/_chrome_json_native.pyx",
    "rl_trace_observer.analysis.gpu._gpu_native": "analysis/gpu/_gpu_native.pyx",
    # the fused per-event loop (merge/transform/fastpath.py), typed
    "rl_trace_observer.merge.timeline._select_native": "merge/timeline/_select_native.pyx",
    "rl_trace_observer.merge.transform._fastpath_native": "merge/transform/_fastpath_native.pyx",
}

# the C macro setup.py defines to the source's sha256 (each .pyx exposes it as SOURCE_SHA256)
HASH_MACRO = "RL_TRACE_SOURCE_SHA256"
