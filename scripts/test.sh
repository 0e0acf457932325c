#!/usr/bin/env bash
# The one test command (README, .ci/run): set up, lint, type-check, then the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0

echo "== ruff"
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/ruff check src tests benchmarks
echo "== mypy (strict on capture, config, merge)"
.venv/bin/mypy
echo "== pytest"
set +e
.venv/bin/python -m pytest -q -p no:cacheprovider --durations=20 "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
