#!/usr/bin/env bash
# The product README's own quick check, exactly as a user runs it, on a fresh clone of this
# repository's HEAD in a temp dir:
#
#   uv venv --python 3.12 && uv pip install -e '.[test,viztracer]' && uv run --no-sync pytest -q
#
# A light install: every test that needs a missing extra must skip naming it, the rest must pass.
# .ci/run runs it after the full suite (CI=true there makes every skip fail, so it is unset here:
# skipping is what a light install is for). uv comes from PyPI (pip) when it is not on PATH;
# Python 3.12 from PATH, else from pyenv's versions.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
say() { echo "light-check: $*"; }

if ! command -v uv >/dev/null 2>&1; then
  tools="${XDG_CACHE_HOME:-$HOME/.cache}/rl-trace-observer/uv-tool"
  if [ ! -x "$tools/bin/uv" ]; then
    say "installing uv from PyPI into $tools"
    python3 -m venv "$tools"
    "$tools/bin/pip" install --quiet 'uv>=0.9,<0.10'
  fi
  export PATH="$tools/bin:$PATH"
fi
if ! python3.12 -c '' >/dev/null 2>&1; then  # a pyenv shim that is not the selected version fails
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  found="$(ls -d "$root"/versions/3.12*/bin 2>/dev/null | sort -V | tail -1 || true)"
  [ -n "$found" ] || { say "no Python 3.12 on PATH or under $root/versions" >&2; exit 1; }
  export PATH="$found:$PATH"
fi

tmp="$(mktemp -d /tmp/rl-trace-light-XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
git clone --quiet "$repo" "$tmp/repo"
cd "$tmp/repo"
say "fresh clone of $(git rev-parse --short HEAD) in $tmp/repo; uv $(uv --version | cut -d' ' -f2)"
export UV_CACHE_DIR="${UV_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/uv}"
log="$tmp/pytest.log"
start=$(date +%s)
set +e
(
  unset CI VIRTUAL_ENV
  uv venv --python 3.12 && uv pip install -e '.[test,viztracer]' && uv run --no-sync pytest -q
) 2>&1 | tee "$log" | grep -v -e '^Resolved' -e '^Prepared' -e '^Installed' -e '^ [+-] ' -e '^Using CPython' \
  -e '^Creating virtual' -e '^Activate with'
rc=${PIPESTATUS[0]}
set -e
seconds=$(($(date +%s) - start))
summary="$(grep -E '^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$' "$log" | tail -1)"
by_extra="$(grep -E "^SKIPPED \[[0-9]+\].*the '[a-z-]+' extra" "$log" | awk -F'[][]' '{n += $2} END {print n + 0}')"
say "${summary:-no pytest summary} — skipped naming an extra: ${by_extra:-0}; ${seconds} s"
# every skip must say why in a way a user can act on: an extra, or a missing tool or data set
vague="$(grep -E '^SKIPPED \[' "$log" | grep -v -E "extra|data set|no real traces|loop-mounted|twin is not built|venv-tokenspeed|Chromium|chromium|browser|needs root" || true)"
if [ -n "$vague" ]; then
  say "skips that name no extra, tool or data set:" >&2
  echo "$vague" >&2
  rc=1
fi
exit "$rc"
