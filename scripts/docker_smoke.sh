#!/usr/bin/env bash
# `make image-smoke`: a real build of both image targets on a machine with no registry and no GPU.
#   1. a base image made here (debootstrap + docker import; Debian has no CUDA toolkit, which the
#      precompiled path does not need), 2. `make image VLLM_BUILD=precompiled` on it, self-tests
#      included, 3. `vllm serve --help` through each image's ENTRYPOINT, the OCI labels checked against
#      the pin file and the patch set, 4. the harness's `--dry-run` docker commands for both tags, each
#      run with `--help` in place of the serve arguments (no GPU here, so without `--gpus`).
# Log in .cache/image-smoke/smoke.log; the run's JSON (per-stage seconds, image sizes and ids, cold or
# cached, provenance) in results/image-smoke-<cold|cached>.json (scripts/image_smoke_result.py), which
# docker/README.md renders (`make report`). A measurement: each run rewrites the file of its kind.
# Env: DOCKER (default /usr/bin/docker, Debian's client: BuildKit without buildx), SMOKE_SUITE
# (trixie), SMOKE_IMAGE_NAME (deepinfer-sm80-smoke), SMOKE_PYTHON (3.13, trixie's).
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKER=${DOCKER:-/usr/bin/docker}
SUITE=${SMOKE_SUITE:-trixie}
NAME=${SMOKE_IMAGE_NAME:-deepinfer-sm80-smoke}
PY_VERSION=${SMOKE_PYTHON:-3.13}
BASE=deepinfer-local/debian:$SUITE
VLLM_VERSION=$(sed -n "s/^VLLM_VERSION=//p" docker/versions.env)
OUT=.cache/image-smoke
mkdir -p "$OUT"
exec > >(tee "$OUT/smoke.log") 2>&1

step() { echo "== $(date -u +%H:%M:%S) $*"; }
die() { echo "image-smoke: $*" >&2; exit 1; }

"$DOCKER" info >/dev/null 2>&1 || die "no Docker daemon answers $DOCKER (apt-get install docker.io; start dockerd)"

step "base image $BASE"
t=$(date +%s)
base_made=0
if ! "$DOCKER" image inspect "$BASE" >/dev/null 2>&1; then
    base_made=1
    command -v debootstrap >/dev/null || die "debootstrap missing (apt-get install debootstrap)"
    root=$(mktemp -d /var/tmp/deepinfer-base.XXXXXX)
    debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$root" http://deb.debian.org/debian
    tar -C "$root" -c . | "$DOCKER" import - "$BASE"
    rm -rf "$root"
fi
base_s=$(( $(date +%s) - t ))

extra=(--build-arg "BASE_IMAGE=$BASE" --build-arg "PYTHON_VERSION=$PY_VERSION" --progress=plain)
# A TLS-inspecting proxy's CA (this machine's bundle), lent to pip as a build secret, never a layer.
if [ -s /etc/ssl/certs/ca-certificates.crt ]; then
    extra+=(--secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt)
fi

step "make image VLLM_BUILD=precompiled"
start=$(date +%s)
make -o .venv/.stamp image DOCKER="$DOCKER" VLLM_BUILD=precompiled IMAGE_NAME="$NAME" IMAGE_EXTRA="${extra[*]}"
build_s=$(( $(date +%s) - start ))

step "labels, sizes, vllm serve --help"
t=$(date +%s)
patches_sha=$(bash docker/patchset_hash.sh patches)
declare -A size
for target in baseline deepinfer; do
    image="$NAME:$target"
    size[$target]=$("$DOCKER" image inspect --format '{{.Size}}' "$image")
    labels=$("$DOCKER" image inspect --format '{{json .Config.Labels}}' "$image")
    echo "$image: $(( ${size[$target]} / 1000000 )) MB, labels $labels"
    for want in "\"ai.deepinfer.patches-sha256\":\"$patches_sha\"" \
                "\"ai.deepinfer.vllm-version\":\"$VLLM_VERSION\"" \
                "\"ai.deepinfer.vllm-build\":\"precompiled\""; do
        grep -qF "$want" <<<"$labels" || die "$image: label $want missing"
    done
    # VLLM_TARGET_DEVICE=cpu: vLLM detects CUDA through NVML (a GPU); the parser needs some platform
    help=$("$DOCKER" run --rm -e VLLM_TARGET_DEVICE=cpu "$image" --help=all 2>&1) \
        || die "$image: vllm serve --help=all failed: ${help: -400}"
    for flag in --tensor-parallel-size --pipeline-parallel-size --distributed-executor-backend; do
        grep -q -- "$flag" <<<"$help" || die "$image: vllm serve --help=all lacks $flag"
    done
    echo "$image: vllm serve --help=all ok ($(wc -l <<<"$help") lines)"
    ray=$("$DOCKER" run --rm --entrypoint ray "$image" --version 2>&1) || die "$image: ray --version failed: $ray"
    echo "$image: $ray (multi-node serving, docker/README.md)"
done

checks_s=$(( $(date +%s) - t ))

step "harness --dry-run against the tags"
t=$(date +%s)
harness_status=ok
.venv/bin/python scripts/image_harness_dryrun.py "$DOCKER" "$NAME" || harness_status=failed
harness_s=$(( $(date +%s) - t ))

step "result JSON"
.venv/bin/python scripts/image_smoke_result.py --log "$OUT/smoke.log" --docker "$DOCKER" \
    --images "$NAME:baseline,$NAME:deepinfer" --base-made "$base_made" \
    --phases "base image (debootstrap + import when absent)=$base_s,make image (both targets; wall)=$build_s,labels + vllm serve --help + ray per image=$checks_s,harness --dry-run commands=$harness_s:$harness_status" \
    --out "results/image-smoke-<cache>.json"
[ "$harness_status" = ok ] || die "the harness's --dry-run commands failed against the tags (log above)"
echo "image-smoke: passed in ${build_s} s of build"
