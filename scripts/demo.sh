#!/usr/bin/env bash
# The one demo command (README): set up only what the demo needs, then run the embedded demo end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh --demo
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
exec .venv/bin/rl-trace demo "$@"
