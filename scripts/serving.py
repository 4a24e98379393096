"""The owner's serving commands, one per supported deployment, built from the harness profile it matches.

One source: a deployment's topology, partition, speculative config, KV dtype, context length, serve
flags and environment are the harness profile's (harness/profiles/<name>.yaml), read with the harness's
own loader and turned into `vllm serve` arguments by the harness's own `serve_args` / `serve_env`
(deepinfer_harness/run/launch.py), the functions `make bench-ab` launches its servers with. The owner's
command differs from the harness's in named pieces only (HARNESS_ONLY): the harness's measurement
flags, the dev-mode endpoints it resets the prefix cache through, and its loopback host.
docs/SERVING.md renders these commands (`make report`, kind `serve-command`); tests/test_serving.py
parses the rendered text with vLLM 0.32.0's own `vllm serve` parser and compares it with the profile.

    python scripts/serving.py [PROFILE ...]      # print the commands
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass

from deepinfer_harness.config import Profile, load_profile
from deepinfer_harness.run.launch import HARNESS_FLAGS, docker_gpus, serve_args, serve_env

MODEL = "/models/DeepSeek-V4.1-Flash"  # the checkpoint's directory on the host, mounted read-only
IMAGE = "deepinfer-sm80:deepinfer"  # `make image`'s optimized image (patches 00 + 01)
PORT = 8000
HOST = "0.0.0.0"  # the harness serves on 127.0.0.1; an owner serves clients on other machines
CONTAINER = "deepinfer"
RAY_CONTAINER = "vllm-ray"
RAY_PORT = 6379
# flags and variables `make bench-ab` adds for its measurements, which a served deployment does not need
HARNESS_ONLY_FLAGS: tuple[tuple[str, int], ...] = (
    ("--enable-prompt-tokens-details", 0),
    ("--enable-per-request-metrics", 0),
    ("--stream-interval", 1),
    ("--max-logprobs", 1),
    ("--logprobs-mode", 1),
    ("--per-request-spec-decode-metrics", 1),
)
HARNESS_ONLY_ENV = ("VLLM_SERVER_DEV_MODE",)  # /reset_prefix_cache and /server_info between cells
# the variables a two-node Ray cluster needs on every node (the a800x16-tp8pp2 profile passes them)
SHELL_VAR = re.compile(r"[\w.,:/=@+-]*\$[A-Z_]+[\w.,:/=@$+-]*")  # a word the shell expands: left unquoted
RAY_NODE_ENV = ("VLLM_HOST_IP=$NODE_IP", "NCCL_SOCKET_IFNAME=$IFACE", "GLOO_SOCKET_IFNAME=$IFACE")


@dataclass(frozen=True)
class Deployment:
    profile: str
    title: str


DEPLOYMENTS = (
    Deployment("ga100x6-tp2pp3", "6 GPUs, one node: TP2 x PP3, partition 14,14,12, DSpark K=5"),
    Deployment("ga100x8-tp4pp2", "8 GPUs, one node: TP4 x PP2, partition 20,20, DSpark K=5"),
    Deployment("a800x16-tp8pp2", "16 GPUs, two 8-GPU nodes over Ray: TP8 x PP2, partition 20,20, DSpark K=5"),
)


def harness_only(args: list[str]) -> list[str]:
    """`args` without the harness's measurement flags (each with its value, if it takes one)."""
    width = dict(HARNESS_ONLY_FLAGS)
    out, i = [], 0
    while i < len(args):
        if args[i] in width:
            i += 1 + width[args[i]]
            continue
        out.append(args[i])
        i += 1
    return out


def owner_serve_args(profile: Profile) -> list[str]:
    """`vllm serve` arguments: the harness's for arm B, less HARNESS_ONLY_FLAGS, on HOST:PORT, the model
    positional as vLLM 0.32.0 asks (the harness's `serve_args` already puts it first)."""
    args = harness_only(serve_args(profile, MODEL, PORT))
    assert not set(HARNESS_FLAGS) - set(dict(HARNESS_ONLY_FLAGS)) - {"1", "20", "raw_logprobs"}
    assert args[0] == MODEL, args
    return [HOST if a == profile.server.host and args[i - 1] == "--host" else a for i, a in enumerate(args)]


def owner_env(profile: Profile) -> dict[str, str]:
    """The server's environment: the harness's for arm B, less HARNESS_ONLY_ENV."""
    return {k: v for k, v in serve_env(profile, "B").items() if k not in HARNESS_ONLY_ENV}


def _env_flags(env: dict[str, str]) -> list[str]:
    return [x for k, v in sorted(env.items()) for x in ("-e", f"{k}={v}")]


def commands(profile: Profile) -> list[tuple[str, list[str]]]:
    """(where it runs, argv) in order. One node: one `docker run`. Ray: a head and a worker container,
    then `vllm serve` inside the head's."""
    env, args = owner_env(profile), owner_serve_args(profile)
    mount = ["-v", f"{MODEL}:{MODEL}:ro"]
    docker = [
        "docker",
        "run",
        "-d",
        "--gpus",
        docker_gpus(profile),
        "--ipc=host",
        "--network=host",
        "--shm-size",
        "16g",
    ]
    if not profile.topology.ray:
        return [("the node", [*docker, "--name", CONTAINER, *mount, *_env_flags(env),
                              "--entrypoint", "vllm", IMAGE, "serve", *args])]  # fmt: skip
    node = [*docker, "--name", RAY_CONTAINER, *mount, *_env_flags(env)]
    node += [x for v in RAY_NODE_ENV for x in ("-e", v)]
    ray = ["--entrypoint", "ray", IMAGE, "start"]
    where = "$NODE_IP"
    head = [*node, *ray, "--head", "--port", str(RAY_PORT), "--node-ip-address", where, "--block"]
    worker = [*node, *ray, "--address", f"$HEAD_IP:{RAY_PORT}", "--node-ip-address", where, "--block"]
    serve = ["docker", "exec", RAY_CONTAINER, "vllm", "serve", *args]
    return [("node 1 (head)", head), ("node 2 (worker)", worker),
            ("node 1, once `ray status` there lists 16 GPUs", serve)]  # fmt: skip


def shell(argv: list[str]) -> str:
    """One command as the doc prints it: after the subcommand (`serve`, `start`) a flag and its value per
    line; `$VAR` words are left for the shell to expand."""
    words = [w if SHELL_VAR.fullmatch(w) else shlex.quote(w) for w in argv]
    sub = next((i for i, w in enumerate(words) if w in ("serve", "start")), len(words))
    lines, cur = [], words[0]
    for i, w in enumerate(words[1:], 1):
        if w.startswith("-") and (i > sub or len(cur) > 70):
            lines.append(cur)
            cur = "  " + w
        else:
            cur += " " + w
    return " \\\n".join([*lines, cur])


def render(profile_name: str) -> str:
    """The markdown of one deployment's commands: a fenced block per step."""
    profile = load_profile(profile_name)
    out = []
    for where, argv in commands(profile):
        out.append(f"On {where}:\n```bash\n{shell(argv)}\n```")
    return "\n".join(out)


def parse_shell(text: str) -> list[str]:
    """A rendered command back into argv (continuations joined, `$VAR` kept as written)."""
    return shlex.split(text.replace("\\\n", " "))


def main(argv: list[str]) -> int:
    for name in argv or [d.profile for d in DEPLOYMENTS]:
        print(f"# {name}\n{render(name)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
