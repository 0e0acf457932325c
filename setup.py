"""The merger's optional compiled twin of its ``.pftrace`` encoder (Cython; see README "Dependencies").

The pure-Python code stays the reference: ``writers/_pftrace_native.pyx`` reproduces
``FusedWriter``'s loops byte for byte and tests compare the two. A machine without a C compiler still
installs: the extension is optional and the merger falls back to Python. (``transform/fastpath.py``
compiled as is saved 0-5 % of a ``.json.gz`` merge's CPU: not worth a second twin.)
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

PKG = "src/rl_trace_observer/merge"
TWINS = {
    "rl_trace_observer.merge.writers._pftrace_native": f"{PKG}/writers/_pftrace_native.pyx",
    "rl_trace_observer.analysis.gpu._gpu_native": "src/rl_trace_observer/analysis/gpu/_gpu_native.pyx",
}


def _extensions() -> list[Extension]:
    if os.environ.get("RL_TRACE_BUILD_NATIVE", "1") == "0":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # building without Cython: the Python path only
        return []
    exts = [Extension(name, [src], optional=True) for name, src in TWINS.items()]
    return cythonize(
        exts,
        build_dir="build/cython",
        quiet=True,
        compiler_directives={"language_level": 3},
    )


setup(ext_modules=_extensions())
