#!/usr/bin/env bash
# CI's image check: `make image-smoke` on the CI machine itself (CPU only, no registry).
#   Installs Debian's docker.io and debootstrap when absent, starts a dockerd of its own when none
#   answers (and stops exactly that one at the end), then runs the smoke build (its measured stages:
#   results/image-smoke-*.json, rendered in docker/README.md); when less than DOCKER_CI_MIN_LEFT_S of
#   the budget is left after `make test`, it says so and skips.
# Usage: scripts/docker_ci.sh CI_START_EPOCH_S
set -euo pipefail
cd "$(dirname "$0")/.."
start=${1:-$(date +%s)}
budget=${CI_BUDGET_S:-5400}
need=${DOCKER_CI_MIN_LEFT_S:-2700}
left=$((budget - ($(date +%s) - start)))
if [ "$left" -lt "$need" ]; then
    echo "docker-ci: skipped: ${left} s of CI's ${budget} s left, the smoke build needs up to ${need} s"
    exit 0
fi

# two images sharing their layers plus the build cache and the base (sizes: results/image-smoke-*.json)
need_gb=${DOCKER_CI_MIN_FREE_GB:-30}
free_gb=$(df -Pk /var/lib 2>/dev/null | awk 'NR==2 {print int($4 / 1048576)}')
if [ "${free_gb:-0}" -lt "$need_gb" ]; then
    echo "docker-ci: skipped: ${free_gb:-?} GB free under /var/lib, the smoke build needs ${need_gb} GB"
    exit 0
fi
if ! command -v /usr/bin/docker >/dev/null || ! command -v debootstrap >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q docker.io debootstrap
fi
started=""
if ! /usr/bin/docker info >/dev/null 2>&1; then
    /usr/sbin/dockerd >/tmp/docker-ci-dockerd.log 2>&1 &
    started=$!
    trap 'kill "$started" 2>/dev/null || true; wait "$started" 2>/dev/null || true' EXIT
    for _ in $(seq 60); do /usr/bin/docker info >/dev/null 2>&1 && break; sleep 1; done
    /usr/bin/docker info >/dev/null 2>&1 || { echo "docker-ci: dockerd did not start (/tmp/docker-ci-dockerd.log)" >&2; exit 1; }
fi
t0=$(date +%s)
make image-smoke DOCKER=/usr/bin/docker
echo "docker-ci: make image-smoke passed in $(( $(date +%s) - t0 )) s"
