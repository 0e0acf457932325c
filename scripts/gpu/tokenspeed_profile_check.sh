#!/usr/bin/env bash
# Run on a GPU host where TokenSpeed 0.1.1 (with tokenspeed-kernel and tokenspeed-triton) and this
# package are installed in one environment (PYTHON, default: python). Nothing is downloaded: the
# model is created locally. Prints one line per check and exits non-zero when one fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python}
OUT=${1:-out/gpu-tokenspeed-check}
rm -rf "$OUT" && mkdir -p "$OUT"
"$PYTHON" -c 'import tokenspeed, torch; assert torch.cuda.is_available(), "no GPU"; print("tokenspeed", tokenspeed.__version__)'
timeout 1500 "$PYTHON" scripts/gpu/tokenspeed_profile_check.py "$OUT" --tp "${TP:-1}" \
  --command "$PYTHON -m tokenspeed.cli serve"
