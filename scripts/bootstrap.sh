#!/usr/bin/env bash
# Set up what the tests (default) or only the demo (--demo) need, idempotently, with one line per step.
#   full:   a .venv with the package and all extras (torch pinned to the local CPU wheel through
#           constraints/torch-cpu.txt), Debian's chromium-headless-shell for the offline Perfetto
#           engine, and the TokenSpeed stand-in environment .venv-tokenspeed (scripts/test.sh, CI).
#   --demo: the package with the extras `rl-trace demo` runs on (demo: ray, rl-insight, viztracer,
#           torch; shards and sql for the commands it prints next) - no VERL, no Chromium, no
#           TokenSpeed stand-in (scripts/demo.sh).
# Re-running is cheap: a stamp file keyed on pyproject.toml + constraints skips pip when nothing
# changed; a full set-up also satisfies --demo.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
  --demo) mode=demo ;;
  "") ;;
  *) echo "usage: bash scripts/bootstrap.sh [--demo]" >&2; exit 2 ;;
esac
t0=$SECONDS
step() { echo "bootstrap [$((SECONDS - t0)) s] $*"; }

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

if [ "$mode" = full ] && ! command -v chromium-headless-shell >/dev/null 2>&1 \
    && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    step "installing chromium-headless-shell (Debian) for the offline Perfetto engine"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null
  else
    echo "bootstrap: please run: sudo apt-get install -y chromium-headless-shell" >&2
  fi
fi

# The compiled twins (.pyx) need a C and a C++ compiler; without them the pure-Python path runs.
if [ "$mode" = full ] && ! command -v g++ >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  step "installing g++ (Debian) for the compiled twins"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null || true
fi

[ -x .venv/bin/python ] || { step "creating .venv with $PYTHON"; "$PYTHON" -m venv .venv; }
stamp=.venv/.rl-trace-bootstrap
want=$(cat pyproject.toml setup.py constraints/*.txt | sha256sum | cut -d' ' -f1)
have=$(cat "$stamp" 2>/dev/null || true)
# The stamp is "<hash>" after a full set-up (what older scripts wrote too) or "<hash> demo".
extras=all
[ "$mode" = demo ] && extras=demo,shards,sql
if [ "$have" = "$want" ] || { [ "$mode" = demo ] && [ "$have" = "$want demo" ]; }; then
  need_pip=0
else
  need_pip=1
fi
# pip's own lines, less the ones that say nothing new (errors and what it fetches stay visible).
quiet_pip() {
  grep --line-buffered -v -E '^ *(Requirement already satisfied|Using cached|Obtaining|Preparing|Getting requirements|Checking if build|Installing (build|backend)|Downloading|Stored in|Created wheel|Building wheel for|Building editable)' || true
}
if [ "$need_pip" = 1 ]; then
  pipi=(.venv/bin/python -m pip install --progress-bar off -c constraints/torch-cpu.txt)
  step "1/3 pip itself"
  .venv/bin/python -m pip install -q --upgrade pip
  step "2/3 torch 2.13.0 (the local CPU wheel)"
  "${pipi[@]}" -q torch==2.13.0
  step "3/3 rl-trace-observer[$extras] and its dependencies, with the compiled .pftrace encoder"
  "${pipi[@]}" -e ".[$extras]" 2>&1 | quiet_pip
  if [ "$mode" = full ]; then echo "$want" > "$stamp"; else echo "$want demo" > "$stamp"; fi
  rm -f .venv/.rl-trace-native  # built by that install: stamped below without a second build
  touch .venv/.rl-trace-native-fresh
fi

# The merger's compiled .pftrace encoder (setup.py: Cython, optional). pip builds it with the install
# above; rebuild when its source changed, since a twin older than its source is ignored (merge/writers/native.py).
native_stamp=.venv/.rl-trace-native
native_want=$(cat setup.py src/rl_trace_observer/merge/writers/_pftrace_native.pyx \
  src/rl_trace_observer/analysis/gpu/_gpu_native.pyx | sha256sum | cut -d' ' -f1)
if [ -e .venv/.rl-trace-native-fresh ]; then
  rm .venv/.rl-trace-native-fresh
  echo "$native_want" > "$native_stamp"
elif [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_want" ]; then
  step "building the compiled twins (Cython: the .pftrace encoder, the report's GPU loops)"
  .venv/bin/python -m pip install -q --no-deps -c constraints/torch-cpu.txt -e .
  echo "$native_want" > "$native_stamp"
fi

if [ "$mode" = demo ]; then
  step "done: .venv has what rl-trace demo needs"
  exit 0
fi

# The CPU stand-in `tokenspeed serve` (tests/tokenspeed_standin) runs TokenSpeed's real control code in
# its own environment: tokenspeed 0.1.1 pins transformers 5.12.0 while VERL 0.9.1 needs < 5.11. Only
# the pure-Python parts are installed (--no-deps); its GPU kernel packages are stubbed at run time and
# torch is the CPU wheel on disk (never let tokenspeed's or compressed-tensors' deps pick a torch).
ts_stamp=.venv-tokenspeed/.rl-trace-bootstrap
ts_want=$(cat tests/tokenspeed_standin/requirements.txt constraints/torch-cpu.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$ts_stamp" 2>/dev/null)" != "$ts_want" ]; then
  step "installing the TokenSpeed stand-in environment into .venv-tokenspeed (tests only)"
  rm -rf .venv-tokenspeed
  "$PYTHON" -m venv --without-pip .venv-tokenspeed
  tspip=(.venv/bin/python -m pip --python .venv-tokenspeed/bin/python install -q -c constraints/torch-cpu.txt)
  "${tspip[@]}" torch==2.13.0
  "${tspip[@]}" -r tests/tokenspeed_standin/requirements.txt
  "${tspip[@]}" --no-deps tokenspeed==0.1.1 tokenspeed-smg-grpc-proto==0.4.18.post20260920
  echo "$ts_want" > "$ts_stamp"
fi
step "done: .venv and .venv-tokenspeed have what the tests need"
