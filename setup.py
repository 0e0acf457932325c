"""Optional compiled twins of the merger's two hottest loops (Cython; see README "Dependencies").

The pure-Python modules stay the reference: each twin is built from the same source
(``transform/fastpath.py`` compiled as is) or reproduces it byte for byte (``writers/_pftrace_native.pyx``
vs ``FusedWriter._write_thread``), and tests compare the two. A machine without a C compiler still
installs: the extensions are optional and the merger falls back to Python.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

PKG = "src/rl_trace_observer/merge"
TWINS = {
    "rl_trace_observer.merge.transform._fastpath_native": f"{PKG}/transform/fastpath.py",
    "rl_trace_observer.merge.writers._pftrace_native": f"{PKG}/writers/_pftrace_native.pyx",
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
