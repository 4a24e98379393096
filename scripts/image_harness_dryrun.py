"""Run the harness's own `docker run` commands (from `bench-ab --dry-run`) against built image tags.

Usage: python scripts/image_harness_dryrun.py DOCKER IMAGE_NAME
For each target (baseline, deepinfer) takes the first docker command the harness prints for that tag,
keeps it up to the image and the serve subcommand, drops `--gpus` (no GPU or NVIDIA runtime on a CPU
host) and `-v` (no checkpoint here), adds `-e VLLM_TARGET_DEVICE=cpu` (vLLM finds its CUDA platform
only through NVML, i.e. a GPU; without one the argument parser cannot build its defaults), appends
`--help=all`, runs it and checks vLLM's serve help came back with the flags the harness passes.
Exits 1 naming the target whose command failed.
"""

from __future__ import annotations

import shlex
import subprocess
import sys

DROP_WITH_VALUE = ("--gpus", "-v")
# serve flags the A/B profiles pass; each one the harness prints must be known to this image's vLLM
PASSED_FLAGS = (
    "--tensor-parallel-size",
    "--pipeline-parallel-size",
    "--kv-cache-dtype",
    "--speculative-config",
    "--max-model-len",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--gpu-memory-utilization",
    "--trust-remote-code",
    "--distributed-executor-backend",
)


def harness_commands(image_name: str) -> str:
    argv = [
        sys.executable,
        "-m",
        "deepinfer_harness",
        "bench-ab",
        "--profile",
        "a100x8-tp8",
        "--model",
        "/models/DeepSeek-V4.1-Flash",
        "--image",
        f"A={image_name}:baseline",
        "--image",
        f"B={image_name}:deepinfer",
        "--dry-run",
        # no checkpoint on a build machine: the commands are the subject here, not the weights
        "--skip-check",
        "model",
        "--no-progress",
        "--results",
        "/tmp/deepinfer-image-dryrun",
    ]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def runnable(line: str, image: str, docker: str) -> list[str]:
    argv = shlex.split(line.split("] ", 1)[1] if line.startswith("[") else line)
    cut = argv.index(image) + 2  # the image and the subcommand after it (serve)
    kept: list[str] = []
    words = iter(argv[1:cut])
    for word in words:
        if word in DROP_WITH_VALUE:
            next(words)
            continue
        kept.append(word)
    return [docker, kept[0], "-e", "VLLM_TARGET_DEVICE=cpu", *kept[1:], "--help=all"]


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: image_harness_dryrun.py DOCKER IMAGE_NAME", file=sys.stderr)
        return 2
    docker, name = argv[1], argv[2]
    printed = harness_commands(name)
    for target in ("baseline", "deepinfer"):
        image = f"{name}:{target}"
        line = next((ln for ln in printed.splitlines() if "docker run " in ln and f" {image} " in ln), None)
        if line is None:
            print(f"image_harness_dryrun: the harness printed no docker run for {image}", file=sys.stderr)
            return 1
        cmd = runnable(line, image, docker)
        print(f"harness: {line.strip()[:160]} ...")
        print(f"run:     {shlex.join(cmd)}")
        res = subprocess.run(cmd, capture_output=True, text=True)
        wanted = [w for w in shlex.split(line) if w in PASSED_FLAGS]
        missing = [w for w in wanted if w not in res.stdout]
        if res.returncode != 0 or "--tensor-parallel-size" not in res.stdout or missing:
            why = f"flags not in the help: {missing}" if missing else res.stderr[-400:]
            print(f"image_harness_dryrun: {target}: exit {res.returncode}: {why}", file=sys.stderr)
            return 1
        lines = len(res.stdout.splitlines())
        print(f"ok:      {target}: vllm serve --help through the harness's command ({lines} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
