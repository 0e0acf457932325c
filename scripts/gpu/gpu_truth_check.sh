#!/usr/bin/env bash
# Run on a GPU host where CUDA torch and this package are installed in one environment (PYTHON,
# default: python). HTA 0.5.0 is installed into its own venv (~/.cache/rl-trace-observer/hta-0.5.0)
# from the package index. Prints one line per check and exits non-zero when one fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
OUT=${1:-out/gpu-truth-check}
"$PYTHON" -c 'import torch; assert torch.cuda.is_available(), "no GPU"; print("torch", torch.__version__, torch.cuda.device_count(), "GPU(s)")'
timeout 900 "$PYTHON" scripts/gpu/gpu_truth_check.py "$OUT"
