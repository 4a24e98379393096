#!/usr/bin/env bash
# Snapshot the image's build context into DEST, so `make image` builds both targets from the same
# bytes: the two images must differ only by patch level 01, even while the checkout is being edited.
# DEST gets docker/, patches/, overlay/ (no caches or tests), the official wheel (hard link) and
# REVISION (git HEAD, `-dirty` when those paths differ from it). Usage: docker_context.sh DEST
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:?usage: docker_context.sh DEST}
wheel=$(sed -n 's/^VLLM_WHEEL=//p' docker/versions.env)
[ -f ".cache/wheels/$wheel" ] || { echo "docker_context: .cache/wheels/$wheel missing: run make fetch-vllm" >&2; exit 1; }
tmp="$dest.partial"
rm -rf "$tmp"
mkdir -p "$tmp/.cache/wheels"
for dir in docker patches overlay; do
    cp -a "$dir" "$tmp/$dir"
done
find "$tmp" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +
rm -rf "$tmp/overlay/tests"
ln ".cache/wheels/$wheel" "$tmp/.cache/wheels/$wheel" 2>/dev/null || cp ".cache/wheels/$wheel" "$tmp/.cache/wheels/"
# engines whose frontend ignores <Dockerfile>.dockerignore (Debian's 20.10) read the root one
cp docker/Dockerfile.sm80.dockerignore "$tmp/.dockerignore"
rev=$(git rev-parse HEAD)
git diff --quiet HEAD -- docker patches overlay || rev="$rev-dirty"
echo "$rev" >"$tmp/REVISION"
rm -rf "$dest"
mv "$tmp" "$dest"
echo "docker_context: $dest at $rev, patch set $(bash "$dest/docker/patchset_hash.sh" "$dest/patches" | cut -c1-12)"
