#!/usr/bin/env bash
# Run on a GPU host where torch (CUDA build), nvidia-smi and this package with its `metrics` extra
# (prometheus_client, psutil, nvidia-ml-py) are installed in one environment (PYTHON, default: python).
# Samples the real GPU with the metric sampler during a CUDA workload on cuda:0 (~25 s) and checks
# utilisation, memory, power/clock, GPM (Hopper+), the process→GPU mapping and the merged counter
# tracks against nvidia-smi. Prints one line per check; exits non-zero when one fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
OUT=${1:-out/gpu-metrics-check}
rm -rf "$OUT" "$OUT-nodes" && mkdir -p "$OUT"
command -v nvidia-smi >/dev/null || { echo "nvidia-smi not found"; exit 2; }
"$PYTHON" -c 'import torch, pynvml, prometheus_client, psutil; assert torch.cuda.is_available(), "no GPU"; print("torch", torch.__version__, "nvidia-ml-py", pynvml.__file__)'
timeout 300 "$PYTHON" scripts/gpu/metrics_sampler_check.py "$OUT"
