#!/usr/bin/env bash
# Issue 38: vLLM 0.32.0's engine on the lent GPU, tiny V4.1 checkpoint, through the SM8x path (capability
# forced to 8.0), CUDA graphs and the async scheduler, at the DeepInfer then the base level.
# Usage (on the device; .cache/gpu-engine carried, see scripts/gpu_engine_bundle.py):
#   DEEPINFER_GIT_SHA=<full sha: git rev-parse HEAD> bash scripts/gpu_engine.sh OUT_DIR [ENGINES]
# ENGINES: name@level list for `python -m deepinfer_sm80.testing.e2e.gpu run` (default: all, in its order).
# Each step is time-boxed (scripts/timebox.sh) and writes its JSON straight into OUT_DIR when it ends:
# setup.json (versions folded in), <engine>-<level>.json; logs.tar.gz is rewritten after every step. A failing
# step never stops the call. GPU_ENGINE_DRY=1 runs the CPU-checkable parts only (no engine), anywhere.
set -uo pipefail
OUT_DIR=${1:?out dir}; ENGINES=${2:-}
[ -n "${DEEPINFER_GIT_SHA:-}" ] || { echo "gpu_engine: set DEEPINFER_GIT_SHA (the device copy has no .git)" >&2; exit 2; }
BUNDLE=${GPU_ENGINE_BUNDLE:-.cache/gpu-engine}
[ -f "$BUNDLE/READY" ] || { echo "gpu_engine: no bundle at $BUNDLE (python scripts/gpu_engine_bundle.py; carry it)" >&2; exit 2; }
PY=${PYTHON:-python3}
E2E=${GPU_ENGINE_WORK:-/tmp/gpu-e2e}; WORK=$E2E/logs
rm -rf "$E2E"; mkdir -p "$WORK" "$E2E/sites/base/site" "$E2E/sites/optimized/site" "$OUT_DIR"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$SECONDS
BUDGET=${GPU_ENGINE_BUDGET_S:-570}  # the call's 600 s less the reply
# shellcheck source=scripts/timebox.sh
. "$(dirname "$0")/timebox.sh"  # step NAME SECONDS CMD...
pack() { tar czf "$OUT_DIR/logs.tar.gz" -C "$E2E" logs work/runs 2>/dev/null || tar czf "$OUT_DIR/logs.tar.gz" -C "$E2E" logs; }

versions() {
  "$PY" - "$OUT_DIR/versions.json" <<'EOF'
import json, platform, shutil, subprocess, sys
from importlib import metadata
def v(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None
def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception as exc:
        return f"failed: {exc!r}"
names = ["torch", "triton", "transformers", "tokenizers", "huggingface-hub", "pydantic", "fastapi", "openai",
         "pyzmq", "msgspec", "numpy", "safetensors", "tilelang", "flashinfer-python", "xgrammar", "numba",
         "cuda-python", "nvidia-ml-py", "sentencepiece", "tiktoken", "cbor2", "blake3", "setuptools", "psutil"]
out = {"python": platform.python_version(), "packages": {n: v(n) for n in names},
       "nvidia_smi": sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,"
                         "temperature.gpu,utilization.gpu", "--format=csv"]),
       "nvcc": sh(["nvcc", "--version"]).splitlines()[-1:], "patch": shutil.which("patch"),
       "cpus": __import__("os").cpu_count()}
try:
    import torch
    out["torch_cuda"] = torch.version.cuda
    out["device"] = torch.cuda.get_device_name(0)
    out["capability"] = list(torch.cuda.get_device_capability(0))
except Exception as exc:
    out["torch_error"] = repr(exc)
json.dump(out, open(sys.argv[1], "w"), indent=1)
print(json.dumps(out)[:1500])
EOF
}

setup() {
  set -e
  if [ "${GPU_ENGINE_DRY:-}" = 1 ]; then
    echo "dry run: the cp312 wheels are not installed here"; mkdir -p "$E2E/wheels"
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$E2E/wheels" "$BUNDLE"/wheels/*.whl
  fi
  tar xzf "$BUNDLE/vllm-base.tar.gz" -C "$E2E/sites/base/site"
  cp -a "$E2E/sites/base/site/." "$E2E/sites/optimized/site/"
  tar xzf "$BUNDLE/vllm-optimized-delta.tar.gz" -C "$E2E/sites/optimized/site"
  local adopt=1
  if [ -n "${GPU_ENGINE_MODEL:-}" ]; then  # an existing checkpoint (the dry run reuses make tiny-model's)
    ln -s "$(realpath "$GPU_ENGINE_MODEL")" "$E2E/tiny-v41"; adopt=0  # never written to
  else
    PYTHONPATH="$PWD/harness:$PWD/overlay" "$PY" scripts/make_tiny_v41.py --out "$E2E/tiny-v41"
  fi
  # The drafter's distillation does not reproduce here (gpu_engine_bundle.drafter_file): the checkpoint as
  # generated is hashed and recorded, then make tiny-model's Markov head (carried) is written over its own.
  ADOPT=$adopt PYTHONPATH="$PWD/overlay:$PWD/scripts" "$PY" - "$E2E/tiny-v41" "$OUT_DIR/setup.json" "$BUNDLE" <<'EOF'
import json, os, sys, time
from pathlib import Path
from deepinfer_sm80.testing.e2e.gpu import SHARD, shard_sha256
from deepinfer_sm80.testing.provenance import provenance
t = time.perf_counter()
model, bundle = Path(sys.argv[1]), Path(sys.argv[3])
versions = Path(sys.argv[2]).with_name("versions.json")
generated = {"sha256": shard_sha256(model), "manifest": json.loads((model / "tiny_v41.json").read_text())}
adopted = None
if os.environ.get("ADOPT") == "1" and (bundle / "drafter.safetensors").exists():
    from safetensors import safe_open
    from tiny_v41_drafter import patch_tensors
    with safe_open(str(bundle / "drafter.safetensors"), "pt") as f:
        adopted = dict(f.metadata())
        patch_tensors(model / SHARD, {k: f.get_tensor(k) for k in f.keys()})
        adopted["tensors"] = sorted(f.keys())
info = {"versions": json.loads(versions.read_text()) if versions.exists() else None,
        "provenance": provenance("bash scripts/gpu_engine.sh $OUT"), "checkpoint_sha256": shard_sha256(model),
        "checkpoint_manifest": generated["manifest"], "checkpoint_as_generated_sha256": generated["sha256"],
        "drafter_adopted_from_make_tiny_model": adopted, "sha_s": time.perf_counter() - t,
        "note": "torch/triton are the device image's (not the project's pins torch 2.13 / triton 3.7.1)"}
Path(sys.argv[2]).write_text(json.dumps(info, indent=1))
versions.unlink(missing_ok=True)  # folded into setup.json: at most 8 files come back from a call
print(json.dumps(info)[:800])
EOF
}

engines() {
  local args=(--model "$E2E/tiny-v41" --sites "$E2E/sites" --wheels "$E2E/wheels" --raw "$OUT_DIR" --work "$E2E/work"
              --budget "$ENGINE_BUDGET" --engine-timeout "${GPU_ENGINE_TIMEOUT:-300}")
  [ -n "$ENGINES" ] && args+=(--engines "$ENGINES")
  PYTHONPATH="$PWD/overlay" "$PY" -m deepinfer_sm80.testing.e2e.gpu run "${args[@]}"
}

export -f versions setup engines
export OUT_DIR ENGINES BUNDLE PY E2E WORK T0 BUDGET
step versions 40 bash -c versions; cat "$WORK/versions.log" | cut -c1-1500; pack
step setup 200 bash -c setup; tail -5 "$WORK/setup.log"; pack
if [ "${GPU_ENGINE_DRY:-}" = 1 ]; then
  echo "gpu_engine: dry run (no engine)"; ls -la "$OUT_DIR"; exit 0
fi
mkdir -p "$E2E/work"
export ENGINE_BUDGET=$((BUDGET - (SECONDS - T0) - 25))  # the engines' own deadline, inside the step's
step engines "$((BUDGET - (SECONDS - T0) - 10))" bash -c engines; grep -E "^gpu-e2e|Error|error" "$WORK/engines.log" | tail -40 | cut -c1-600
pack
echo "gpu_engine: done in $((SECONDS - T0)) s"
ls -la "$OUT_DIR"
