"""The merger's optional compiled twins (Cython; see README "Dependencies").

The pure-Python code stays the reference: ``merge/output/_pftrace_native.pyx`` reproduces
``FusedWriter``'s loops byte for byte, ``merge/output/_chrome_json_native.pyx`` msgspec's encoding of the
merged events, and tests compare each with its reference. A twin whose source is a ``.py``
(``transform/fastpath.py``, the fused per-event loop) is that very module compiled, under the twin's
name: nothing to keep in step by hand, and the same tests compare it. A machine without a C compiler
still installs: the extensions are optional and the merger falls back to Python.
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


def _python_twin(name: str, src: str) -> str:
    """A ``.py`` source, copied as the twin's own module (Cython names a module after its file) with
    the source's hash as ``SOURCE_SHA256`` (``common/twins.py`` compares it with the source).
    Annotations stay hints: compiled, the module keeps Python's semantics (Cython would otherwise
    make a ``float`` annotation a C double and a ``list`` one a type check)."""
    with open(src, "rb") as f:
        text = f.read()
    dest = os.path.join("build", "cython", "py_twins", *name.split(".")) + ".py"
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    line = f'\nSOURCE_SHA256 = "{hashlib.sha256(text).hexdigest()}"  # setup.py: built from this source\n'
    with open(dest, "wb") as f:  # the directive line first, so the source's lines are one further down
        f.write(b"# cython: annotation_typing=False\n" + text + line.encode())
    return dest


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
            [_python_twin(name, src) if src.endswith(".py") else src],
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
