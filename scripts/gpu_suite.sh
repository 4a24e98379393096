#!/usr/bin/env bash
# `make gpu-suite`, run ON the GPU machine: unpack the bundle (no package index there), run every
# GPU test and benchmark, write JSON + logs under OUT_DIR.
# Usage: scripts/gpu_suite.sh BUNDLE_DIR OUT_DIR [bench module short names...]
set -euo pipefail
BUNDLE=${1:?bundle dir}; OUT_DIR=${2:?out dir}; shift 2
SITE=/tmp/deepinfer-site; TREE=/tmp/deepinfer-vllm
test -f "$BUNDLE/READY" || { echo "gpu-suite: $BUNDLE has no READY (run make gpu-bundle)"; exit 2; }
mkdir -p "$OUT_DIR"
if [ ! -f "$SITE/.done" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$BUNDLE"/wheels/*.whl
  touch "$SITE/.done"
fi
if [ ! -f "$TREE/.done" ]; then
  mkdir -p "$TREE" && tar xzf "$BUNDLE/vllm-tree.tar.gz" -C "$TREE" && touch "$TREE/.done"
fi
export PYTHONPATH="$PWD/overlay:$SITE:$TREE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -c 'import torch, triton; p = torch.cuda.get_device_properties(0); print(f"{p.name} sm_{p.major}{p.minor} {p.multi_processor_count} SMs | torch {torch.__version__} | triton {triton.__version__}")'
status=0
if [ -z "${SKIP_TESTS:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider ${TESTS:-overlay/tests} --junitxml="$OUT_DIR/gpu-tests.xml" 2>&1 | tee "$OUT_DIR/gpu-tests.log" | tail -25 || status=1
fi
python3 -m deepinfer_sm80.bench --out "$OUT_DIR" ${1:+--only "$@"} 2>&1 | tee "$OUT_DIR/bench.log" | grep -v "^\s*$" || status=1
exit $status
