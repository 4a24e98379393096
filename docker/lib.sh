# Shell helpers shared by the Dockerfile's RUN steps and scripts/docker_*.sh (sourced, not run).
# The pin file is read line by line, never sourced: `TORCH_CUDA_ARCH_LIST=8.0 8.6` is a Makefile
# assignment, and sourcing it in sh would run `8.6` as a command.

DEEPINFER_PINS=${DEEPINFER_PINS:-/opt/deepinfer/versions.env}

# pin KEY -> the value of KEY in the pin file; a missing key is an error naming it.
pin() {
    local value
    value=$(sed -n "s/^$1=//p" "$DEEPINFER_PINS")
    if [ -z "$value" ]; then
        echo "pin: $1 is not set in $DEEPINFER_PINS" >&2
        return 1
    fi
    printf '%s\n' "$value"
}

# verify_sha256 FILE SHA256 -> refuses FILE (exit 1, one line naming it) unless its digest matches.
verify_sha256() {
    local file=$1 want=$2 got
    if [ ! -f "$file" ]; then
        echo "verify_sha256: $file: no such file" >&2
        return 1
    fi
    got=$(sha256sum "$file" | cut -d' ' -f1)
    if [ "$got" != "$want" ]; then
        echo "verify_sha256: $(basename "$file"): sha256 $got does not match the pinned $want; refusing it" >&2
        return 1
    fi
    echo "verify_sha256: $(basename "$file"): sha256 ok ($want)"
}

# Behind a TLS-inspecting proxy, `--secret id=pip_ca,src=<CA bundle>` lends pip the proxy's CA for
# the RUN steps that mount it; it is never written into a layer.
if [ -s /run/secrets/pip_ca ]; then
    export PIP_CERT=/run/secrets/pip_ca
fi
