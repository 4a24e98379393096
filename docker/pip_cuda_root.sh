#!/usr/bin/env bash
# Give the CUDA toolkit that pip installed (nvidia/cu13 in site-packages) the layout tools expect:
# ROOT/bin a real directory of links (nvcc finds its libraries from bin/..), include, nvvm, lib with
# unversioned .so names, lib64 -> lib. Usage: pip_cuda_root.sh ROOT   (no-op if ROOT exists)
set -euo pipefail
root=${1:?usage: pip_cuda_root.sh ROOT}
[ -e "$root" ] && exit 0
site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
cu=$site/nvidia/cu13
[ -x "$cu/bin/nvcc" ] || { echo "pip_cuda_root: no pip nvcc under $cu" >&2; exit 1; }
mkdir -p "$root/bin" "$root/lib"
ln -s "$cu"/bin/* "$root/bin/"
ln -s "$cu/include" "$root/include"
ln -s "$cu/nvvm" "$root/nvvm"
ln -s lib "$root/lib64"
for lib in "$cu"/lib/*; do
    ln -s "$lib" "$root/lib/"
    case "$lib" in *.so.*) base=$(basename "$lib"); ln -sf "$lib" "$root/lib/${base%%.so*}.so" ;; esac
done
echo "pip_cuda_root: $root -> $cu ($("$root/bin/nvcc" --version | tail -n1))"
