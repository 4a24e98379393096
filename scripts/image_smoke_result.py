"""The JSON of one `make image-smoke` run, from its log and the built images (scripts/docker_smoke.sh).

Per Dockerfile stage, the seconds BuildKit reports for its steps (`#N DONE 12.3s`, summed; steps of
one stage may overlap, so this is work per stage, not wall), how many steps ran and how many came from
the cache; per image its size (`docker image inspect .Size`, uncompressed) and content id (the
sha256 of its config: a local build has no registry digest); the smoke's own wall-clock phases; cold
or cached (cold: the base image was made in this run and no build step came from the cache). With
provenance, as every results JSON (tests/test_results_provenance.py). docker/README.md renders its
figures from this file (`make report`).

Usage: python scripts/image_smoke_result.py --log LOG --images TAG,TAG --phases NAME=S[:STATUS],...
       --base-made 0|1 --docker DOCKER --out results/image-smoke-<cache>.json (<cache>: cold or cached)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^#(\d+) \[(?:(?P<stage>[\w.-]+) )?(?P<pos>\d+/\d+)\] (?P<what>.*)$")
DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s$")
CACHED = re.compile(r"^#(\d+) CACHED$")


def parse_buildkit(text: str) -> list[dict[str, object]]:
    """Per stage (first-seen order): seconds summed over its DONE steps, steps run, steps cached.

    BuildKit numbers a step `#N` per build, so each `docker build` call in the log is parsed on its
    own: a `#1 [internal] load build definition` line starts the next one.
    """
    stages: dict[str, dict[str, float]] = defaultdict(lambda: {"seconds": 0.0, "run": 0, "cached": 0})
    owner: dict[str, str] = {}
    build = 0
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#1 [internal] load build definition"):
            build += 1
        if m := STEP.match(line):
            if m.group("stage"):
                owner[f"{build}:{m.group(1)}"] = m.group("stage")
                stages[m.group("stage")]  # keep first-seen order
        elif m := DONE.match(line):
            stage = owner.get(f"{build}:{m.group(1)}")
            if stage:
                stages[stage]["seconds"] += float(m.group(2))
                stages[stage]["run"] += 1
        elif m := CACHED.match(line):
            stage = owner.get(f"{build}:{m.group(1)}")
            if stage:
                stages[stage]["cached"] += 1
    return [
        {"name": f"docker build stage {name}", "seconds": round(v["seconds"], 1), "steps_run": int(v["run"]),
         "steps_cached": int(v["cached"]), "status": "ok"}
        for name, v in stages.items()
    ]  # fmt: skip


def image_facts(docker: str, tag: str) -> dict[str, object]:
    out = subprocess.run(
        [docker, "image", "inspect", "--format", "{{.Id}} {{.Size}}", tag], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise SystemExit(f"image_smoke_result: docker image inspect {tag}: {out.stderr.strip()[:200]}")
    image_id, size = out.stdout.split()
    return {"tag": tag, "id": image_id, "size_bytes": int(size)}


def targets_of(phases: list[dict], images: list[dict], wanted: int) -> list[dict]:
    """The smoke's own pass/fail as targets: each wall-clock phase ended ok, every tag was built."""
    out = [
        {
            "name": f"phase ok: {p['name']}",
            "measured": int(p["status"] == "ok"),
            "goal": 1,
            "unit": "bool",
            "direction": ">=",
            "met": p["status"] == "ok",
            **({} if p["status"] == "ok" else {"cause": f"phase ended {p['status']} (smoke log)"}),
        }
        for p in phases
    ]
    built = sum(1 for i in images if i.get("size_bytes"))
    out.append(
        {
            "name": "images built",
            "measured": built,
            "goal": wanted,
            "unit": "images",
            "direction": ">=",
            "met": built >= wanted,
            **({} if built >= wanted else {"cause": "a tag has no image (docker image inspect failed)"}),
        }
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--images", required=True, help="comma-separated tags")
    parser.add_argument("--phases", required=True, help="NAME=SECONDS,... of the smoke's own wall clock")
    parser.add_argument("--base-made", choices=("0", "1"), required=True)
    parser.add_argument("--docker", default="docker")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.log.is_file():
        print(f"image_smoke_result: no log at {args.log}", file=sys.stderr)
        return 2
    stages = parse_buildkit(args.log.read_text(errors="replace"))
    if not stages:
        print(f"image_smoke_result: {args.log} has no BuildKit plain-progress steps", file=sys.stderr)
        return 2
    phases = []
    for item in args.phases.split(","):
        name, _, value = item.partition("=")
        seconds, _, status = value.partition(":")
        if not seconds.isdigit():  # a "," inside a phase name split it (the smoke at 4ac35c9 did)
            print(f"image_smoke_result: --phases item {item!r} is not NAME=SECONDS[:STATUS]", file=sys.stderr)
            return 2
        phases.append({"name": name, "seconds": float(seconds), "status": status or "ok"})
    cached = sum(int(s["steps_cached"]) for s in stages)  # type: ignore[call-overload]
    cache = "cold" if args.base_made == "1" and cached == 0 else "cached"
    # the build context's revision (git HEAD, "-dirty" when the built paths differed from it)
    revision = ROOT / ".cache" / "image-context" / "REVISION"
    rev = revision.read_text().strip() if revision.is_file() else ""
    sha = (
        rev.removesuffix("-dirty")
        or subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    )
    docker_version = subprocess.run(
        [args.docker, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True
    ).stdout.strip()
    tags = args.images.split(",")
    images = [image_facts(args.docker, tag) for tag in tags]
    doc = {
        "what": "make image-smoke: VLLM_BUILD=precompiled on a locally made Debian base, both targets",
        "cache": cache,
        "stages": phases + stages,
        "images": images,
        "targets": targets_of(phases, images, len(tags)),
        "provenance": {
            "git_sha": sha or "unknown",
            "git_tree": "dirty (uncommitted built paths)" if rev.endswith("-dirty") else "clean",
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "hardware": f"CPU {platform.machine()}, {os.cpu_count()} logical cores, no GPU",
            # stage seconds scale with the host's load (a shared 2-core machine runs 2-3x slower)
            "load_avg_at_end": [round(x, 2) for x in os.getloadavg()],
            "versions": {"docker": docker_version or "unknown", "python": platform.python_version()},
            "command": "make image-smoke",
        },
    }
    out = Path(str(args.out).replace("<cache>", cache))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"image_smoke_result: {cache} run -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
