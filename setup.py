"""The merger's optional compiled twins (Cython; see README "Dependencies").

The pure-Python code stays the reference: ``merge/output/_pftrace_native.pyx`` reproduces
``FusedWriter``'s loops byte for byte, ``merge/output/_chrome_json_native.pyx`` msgspec's encoding of the
merged events, ``merge/transform/_fastpath_native.pyx`` the fused per-event loop
(``transform/fastpath.py``) on C doubles, and tests compare each with its reference. A machine without
a C compiler still installs: the extensions are optional and the merger falls back to Python.
"""

from __future__ import annotations

import hashlib
import os
import runpy

from setuptools import Extension, setup

ROOT = "src/rl_trace_observer"
# the one list of twins (common/twin_sources.py), read before the package is installed
_LIST = runpy.run_path(f"{ROOT}/common/twin_sources.py")
TWINS = {name: f"{ROOT}/{rel}" for name, rel in _LIST["TWINS"].items()}


def _built_from(src: str) -> tuple[str, str]:
    """The C macro each twin exposes as SOURCE_SHA256: how ``common/twins.py`` tells it is current."""
    with open(src, "rb") as f:
        return (_LIST["HASH_MACRO"], '"' + hashlib.sha256(f.read()).hexdigest() + '"')


def _extensions() -> list[Extension]:
    if os.environ.get("RL_TRACE_BUILD_NATIVE", "1") == "0":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # building without Cython: the Python path only
        return []
    exts = [
        Extension(
            name,
            [src],
            optional=True,
            define_macros=[_built_from(src)],
            extra_compile_args=["-ffp-contract=off"],  # no fused multiply-add: Python's float results
        )
        for name, src in TWINS.items()
    ]
    return cythonize(
        exts,
        build_dir="build/cython",
        quiet=True,
        compiler_directives={"language_level": 3},
    )


setup(ext_modules=_extensions())
