#!/usr/bin/env bash
# Set up everything the demo and the tests need, idempotently: a .venv with the package and all
# extras (torch pinned to the local CPU wheel through constraints/torch-cpu.txt), and Debian's
# chromium-headless-shell for the offline Perfetto engine. Re-running is cheap: a stamp file keyed
# on pyproject.toml + constraints skips pip when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
"$PYTHON" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"'

if ! command -v chromium-headless-shell >/dev/null 2>&1 && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "bootstrap: installing chromium-headless-shell (Debian) for the offline Perfetto engine"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium-headless-shell >/dev/null
  else
    echo "bootstrap: please run: sudo apt-get install -y chromium-headless-shell" >&2
  fi
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
stamp=.venv/.rl-trace-bootstrap
want=$(cat pyproject.toml setup.py constraints/*.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing rl-trace-observer[all] into .venv (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints/torch-cpu.txt torch==2.13.0
  .venv/bin/python -m pip install -q -c constraints/torch-cpu.txt -e '.[all]'
  echo "$want" > "$stamp"
  rm -f .venv/.rl-trace-native  # built by that install: stamped below without a second build
  touch .venv/.rl-trace-native-fresh
fi

# The merger's compiled .pftrace encoder (setup.py: Cython, optional). pip builds it with the install
# above; rebuild when its source changed, since a twin older than its source is ignored (merge/native.py).
native_stamp=.venv/.rl-trace-native
native_want=$(cat setup.py src/rl_trace_observer/merge/writers/_pftrace_native.pyx \
  src/rl_trace_observer/analysis/gpu/_gpu_native.pyx | sha256sum | cut -d' ' -f1)
if [ -e .venv/.rl-trace-native-fresh ]; then
  rm .venv/.rl-trace-native-fresh
  echo "$native_want" > "$native_stamp"
elif [ "$(cat "$native_stamp" 2>/dev/null)" != "$native_want" ]; then
  echo "bootstrap: building the compiled twins (Cython: .pftrace encoder, GPU analysis loops)"
  .venv/bin/python -m pip install -q --no-deps -c constraints/torch-cpu.txt -e .
  echo "$native_want" > "$native_stamp"
fi

# The CPU stand-in `tokenspeed serve` (tests/tokenspeed_standin) runs TokenSpeed's real control code in
# its own environment: tokenspeed 0.1.1 pins transformers 5.12.0 while VERL 0.9.1 needs < 5.11. Only
# the pure-Python parts are installed (--no-deps); its GPU kernel packages are stubbed at run time and
# torch is the CPU wheel on disk (never let tokenspeed's or compressed-tensors' deps pick a torch).
ts_stamp=.venv-tokenspeed/.rl-trace-bootstrap
ts_want=$(cat tests/tokenspeed_standin/requirements.txt constraints/torch-cpu.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$ts_stamp" 2>/dev/null)" != "$ts_want" ]; then
  echo "bootstrap: installing the TokenSpeed stand-in environment into .venv-tokenspeed"
  rm -rf .venv-tokenspeed
  "$PYTHON" -m venv --without-pip .venv-tokenspeed
  tspip=(.venv/bin/python -m pip --python .venv-tokenspeed/bin/python install -q -c constraints/torch-cpu.txt)
  "${tspip[@]}" torch==2.13.0
  "${tspip[@]}" -r tests/tokenspeed_standin/requirements.txt
  "${tspip[@]}" --no-deps tokenspeed==0.1.1 tokenspeed-smg-grpc-proto==0.4.18.post20260920
  echo "$ts_want" > "$ts_stamp"
fi
