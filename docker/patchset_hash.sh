#!/usr/bin/env bash
# The patch-set hash: sha256 over `series`, then every patch it lists, in series order.
# One definition for `make image` (the OCI label) and the image's self-test (which recomputes it).
# Usage: docker/patchset_hash.sh PATCH_DIR   -> prints 64 hex digits
set -euo pipefail
dir=${1:?usage: patchset_hash.sh PATCH_DIR}
series="$dir/series"
[ -f "$series" ] || { echo "patchset_hash: $series: no such file" >&2; exit 1; }
files=("$series")
while read -r name _; do
    case "$name" in ''|'#'*) continue ;; esac
    [ -f "$dir/$name" ] || { echo "patchset_hash: $series lists $name, which is not in $dir" >&2; exit 1; }
    files+=("$dir/$name")
done < "$series"
cat "${files[@]}" | sha256sum | cut -d' ' -f1
