#!/usr/bin/env bash
# The source path's CMake configure step, run where the full compile cannot (2 CPU cores, no GitHub).
# What it shows: vLLM 0.32.0's own CMakeLists.txt, given the pin file's TORCH_CUDA_ARCH_LIST, keeps
# 8.0/8.6 only and decides, kernel by kernel, what it builds and what it skips for them.
# How: in a container of the smoke image (CUDA torch, and the CUDA toolkit wheels of the pinned CUDA
# release, nvcc included), on the pinned sdist from the image build's own vllm-src stage. Stand-ins,
# because GitHub is out of reach here: the pip toolkit gets a CMake-shaped root (symlinks: unversioned
# .so names, lib64 -> lib), and every FetchContent dependency (CUTLASS, triton_kernels, DeepGEMM,
# DeepSelect, fmha_sm100, FlashMLA, FlashKDA, QuTLASS, tml-fa4, vllm-flash-attn) is an empty directory:
# each decides from the arch list whether it builds before its sources matter. Configure completes
# ("Configuring done"); the generate step then fails on the stand-ins' missing link targets, as it must.
# Usage: scripts/docker_source_configure.sh [IMAGE_NAME]  ->  .cache/image-smoke/source-configure.log
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-/usr/bin/docker}
NAME=${1:-deepinfer-sm80-smoke}
OUT=.cache/image-smoke
mkdir -p "$OUT"
log="$OUT/source-configure.log"

# the pinned, sha256-checked sdist tree, from the vllm-src stage (cached by the smoke build)
extra=()
[ -s /etc/ssl/certs/ca-certificates.crt ] && extra+=(--secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt)
ctx=.cache/image-context
[ -d "$ctx" ] || bash scripts/docker_context.sh "$ctx"
(cd "$ctx" && DOCKER_BUILDKIT=1 "$DOCKER" build --network host -q -f docker/Dockerfile.sm80 \
    --build-arg BASE_IMAGE=deepinfer-local/debian:trixie --build-arg PYTHON_VERSION=3.13 "${extra[@]}" \
    --target vllm-src -t "$NAME:vllm-src" .) >/dev/null
src=$(mktemp -d /var/tmp/deepinfer-vllm-src.XXXXXX)
trap 'rm -rf "$src"' EXIT
cid=$("$DOCKER" create "$NAME:vllm-src" true)
"$DOCKER" cp "$cid:/opt/vllm-src/." "$src/"
"$DOCKER" rm "$cid" >/dev/null

ca=()
[ -s /etc/ssl/certs/ca-certificates.crt ] && ca=(-v /etc/ssl/certs/ca-certificates.crt:/run/secrets/pip_ca:ro)
"$DOCKER" run --rm --network host "${ca[@]}" -v "$src:/src" --entrypoint bash "$NAME:baseline" -c '
set -euo pipefail
. /opt/deepinfer/lib.sh
# the nvcc of the pinned CUDA release (the runtime carries a newer one for FlashInfer JIT, whose
# version the CMake config of torch refuses next to the 13.0 headers)
pip install -q $(pin VLLM_BUILD_TOOLS) "cuda-toolkit[nvcc,crt]==$(pin CUDA_VERSION)" >/dev/null
site=$(python -c "import sysconfig; print(sysconfig.get_paths()[\"purelib\"])")
pip_cuda=$site/nvidia/cu13
root=/tmp/cuda
mkdir -p $root/lib $root/bin  # bin/ a real directory: nvcc resolves its libraries from bin/..
ln -s $pip_cuda/bin/* $root/bin/; ln -s $pip_cuda/include $root/include; ln -s $pip_cuda/nvvm $root/nvvm
ln -s lib $root/lib64
for lib in $pip_cuda/lib/*; do
    ln -s "$lib" $root/lib/
    case "$lib" in *.so.*) base=$(basename "$lib"); ln -sf "$lib" "$root/lib/${base%%.so*}.so" ;; esac
done
# empty stand-ins for the GitHub sources (each project decides what to build from the arch list;
# its sources matter only to the compile, which does not run here)
for dep in cutlass triton_kernels deepgemm deepselect fmha_sm100 flashmla flashkda qutlass tml_fa4 flash_attn; do
    mkdir -p /tmp/stubs/$dep && echo "stand-in: no GitHub here" >/tmp/stubs/$dep/STUB
done
for dep in cutlass flash_attn; do
    printf "cmake_minimum_required(VERSION 3.26)\nproject(stub_$dep LANGUAGES NONE)\n" >/tmp/stubs/$dep/CMakeLists.txt
done
mkdir -p /tmp/stubs/flashmla/flash_mla
echo "flash_mla_cuda = torch.ops._flashmla_C" >/tmp/stubs/flashmla/flash_mla/flash_mla_interface.py
export VLLM_CUTLASS_SRC_DIR=/tmp/stubs/cutlass TRITON_KERNELS_SRC_DIR=/tmp/stubs/triton_kernels \
    DEEPGEMM_SRC_DIR=/tmp/stubs/deepgemm DEEPSELECT_SRC_DIR=/tmp/stubs/deepselect \
    FMHA_SM100_SRC_DIR=/tmp/stubs/fmha_sm100 FLASH_MLA_SRC_DIR=/tmp/stubs/flashmla \
    FLASH_KDA_SRC_DIR=/tmp/stubs/flashkda QUTLASS_SRC_DIR=/tmp/stubs/qutlass \
    TML_FA4_SRC_DIR=/tmp/stubs/tml_fa4 VLLM_FLASH_ATTN_SRC_DIR=/tmp/stubs/flash_attn
export CUDA_HOME=$root PATH=$root/bin:$PATH
export TORCH_CUDA_ARCH_LIST="$(pin TORCH_CUDA_ARCH_LIST)"
echo "configure: TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST, $(nvcc --version | tail -n1), $(gcc --version | head -n1)"
cmake -S /src -B /tmp/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DVLLM_TARGET_DEVICE=cuda \
    -DVLLM_PYTHON_EXECUTABLE=$(command -v python) -DFETCHCONTENT_BASE_DIR=/tmp/deps \
    -DCMAKE_CUDA_COMPILER=$root/bin/nvcc -DFETCHCONTENT_FULLY_DISCONNECTED=OFF 2>&1 || true
' 2>&1 | tee "$log"

# what the log must show for the arch list to have been applied
grep -q "CUDA supported target architectures: 8.0;8.6$" "$log" \
    || { echo "source-configure: arch list not parsed to 8.0;8.6 (see $log)" >&2; exit 1; }
grep -q "^-- Configuring done" "$log" || { echo "source-configure: configure did not finish (see $log)" >&2; exit 1; }
echo "source-configure: arch list parsed to 8.0;8.6, configure done; kernel decisions:"
grep -E "Building|Not building|Enabling|will not compile|Skipping build" "$log" | sed 's/^-- /  /'
