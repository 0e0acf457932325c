"""``python -m rl_trace_observer.capture.sampler OUTPUT_DIR``: the node's sampler process (:mod:`.node`)."""

from __future__ import annotations

import sys

from .process import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
