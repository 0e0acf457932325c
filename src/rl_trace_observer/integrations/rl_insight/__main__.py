"""``python -m rl_trace_observer.integrations.rl_insight SCRIPT [ARGS...]``: run a plain RL-Insight
program with our backend registered first, without changing its code (as ``python SCRIPT ARGS``)."""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from . import register  # noqa: F401  (registers the backend)

    sys.argv = list(argv)
    runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
