"""``python -m rl_trace_observer.integrations.areal SCRIPT [ARGS]`` (or ``-m MODULE [ARGS]``): run an
AReaL entry point with the anchor installed (when ``RL_TRACE_AREAL=1``), without editing it."""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__)
        return 2
    from . import register  # noqa: F401  (installs the hook when enabled)

    if argv[0] == "-m":
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
