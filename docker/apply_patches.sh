#!/usr/bin/env bash
# Apply one level of patches/series to an installed vLLM tree: a dry run first, then the real run.
#   docker/apply_patches.sh LEVEL ROOT PATCH_DIR STATE_DIR
#   LEVEL      base (series entries named 00-*) or optimized (01-*)
#   ROOT       the directory that holds vllm/ (site-packages in the image, a copy in tests)
#   STATE_DIR  gets `applied` (name + sha256 of each patch) and `patched-files.sha256`
# A hunk that is rejected, needs fuzz, or lands at an offset fails the whole step, naming the patch
# and the hunk: the patches are made against the pinned tree, so any of those means the wrong tree.
set -euo pipefail
level=${1:?usage: apply_patches.sh LEVEL ROOT PATCH_DIR STATE_DIR}
root=${2:?ROOT missing}
dir=${3:?PATCH_DIR missing}
state=${4:?STATE_DIR missing}

case "$level" in
    base) prefix=00- ;;
    optimized) prefix=01- ;;
    *) echo "apply_patches: level $level: expected base or optimized" >&2; exit 2 ;;
esac
[ -f "$dir/series" ] || { echo "apply_patches: $dir/series: no such file" >&2; exit 1; }
[ -d "$root/vllm" ] || { echo "apply_patches: $root has no vllm/ package" >&2; exit 1; }
mkdir -p "$state"
state=$(cd "$state" && pwd)

selected=()
while read -r name _; do
    case "$name" in
        ''|'#'*) continue ;;
        00-*|01-*) [[ $name == "$prefix"* ]] && selected+=("$name") ;;
        *) echo "apply_patches: series entry $name: names must start with 00- (base) or 01- (optimized)" >&2
           exit 1 ;;
    esac
done < "$dir/series"
if [ ${#selected[@]} -eq 0 ]; then
    echo "apply_patches: $dir/series lists no $prefix* patch for level $level" >&2
    exit 1
fi

flags=(-p1 --batch --forward --fuzz=0 --no-backup-if-mismatch -d "$root")
touched="$state/.touched"
touch "$touched"
for name in "${selected[@]}"; do
    file="$dir/$name"
    [ -f "$file" ] || { echo "apply_patches: series lists $name, which is not in $dir" >&2; exit 1; }
    if ! out=$(patch --dry-run "${flags[@]}" -i "$file" 2>&1); then
        bad=$(grep -m1 -E 'FAILED|Reversed|Skipping|malformed|garbage|No file to patch|can.t find file' <<<"$out" || true)
        echo "apply_patches: $name does not apply to $root: ${bad:-$(tail -n1 <<<"$out")}" >&2
        exit 1
    fi
    if bad=$(grep -m1 -E 'offset|fuzz' <<<"$out"); then
        echo "apply_patches: $name applies only with an offset or fuzz (made against another tree?): $bad" >&2
        exit 1
    fi
    out=$(patch "${flags[@]}" -i "$file" 2>&1) || { echo "apply_patches: $name: $out" >&2; exit 1; }
    sed -n "s/^patching file '\{0,1\}\([^']*\)'\{0,1\}$/\1/p" <<<"$out" >>"$touched"
    printf '%s  %s\n' "$(sha256sum "$file" | cut -d' ' -f1)" "$name" >>"$state/applied"
    echo "apply_patches: $name applied (level $level)"
done
if rejects=$(cd "$root" && find vllm -name '*.rej' -o -name '*.orig' | head -n1) && [ -n "$rejects" ]; then
    echo "apply_patches: leftover $rejects under $root" >&2
    exit 1
fi
# The files as patched, for the self-test's later `sha256sum -c` (a reinstall would undo them).
sort -u "$touched" -o "$touched"
(cd "$root" && xargs -a "$touched" sha256sum) >"$state/patched-files.sha256"
