#!/usr/bin/env bash
# Issue 13's H200 checks in one call (run ON the GPU machine): unpack the bundle, run the SM8x-path GPU
# tests (writers and o_proj vs upstream's hardware-fp8 / bf16 code, the attention layer at forced 8.0
# with production shapes), record every Triton launch for the reachability scan.
# Usage: scripts/patches_gpu.sh BUNDLE_DIR OUT_DIR
set -euo pipefail
BUNDLE=${1:?bundle dir}; OUT_DIR=${2:?out dir}
SITE=/tmp/deepinfer-site; TREE=/tmp/deepinfer-vllm
test -f "$BUNDLE/READY" || { echo "patches-gpu: $BUNDLE has no READY (run make gpu-bundle)"; exit 2; }
mkdir -p "$OUT_DIR" "$SITE" "$TREE"
[ -f "$SITE/.done" ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$BUNDLE"/wheels/*.whl && touch "$SITE/.done"; }
[ -f "$TREE/.done" ] || { tar xzf "$BUNDLE/vllm-tree.tar.gz" -C "$TREE" && touch "$TREE/.done"; }
export PYTHONPATH="$PWD/overlay:$SITE:$TREE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export DEEPINFER_KERNEL_TRACE="$OUT_DIR/launches.jsonl"
python3 -c 'import torch, triton; p = torch.cuda.get_device_properties(0); print(f"{p.name} sm_{p.major}{p.minor} | torch {torch.__version__} | triton {triton.__version__}")' | tee "$OUT_DIR/device.txt"
python3 -m pytest -q -p no:cacheprovider -p deepinfer_sm80.testing.kernel_trace -rs \
  overlay/tests/ops/test_compress_insert.py overlay/tests/ops/test_engram.py overlay/tests/ops/test_o_proj.py \
  overlay/tests/integration/test_pack_seq.py overlay/tests/integration/test_sm8x_attention.py \
  -k "${PATCHES_GPU_K:-upstream or topk512 or front}" --junitxml="$OUT_DIR/patches-gpu-tests.xml" 2>&1 | tee "$OUT_DIR/patches-gpu-tests.log" | tail -40
