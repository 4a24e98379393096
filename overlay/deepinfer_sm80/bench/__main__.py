"""Run every GPU benchmark module and write one provenance-stamped JSON per module.

Usage: python -m deepinfer_sm80.bench --out DIR [--only NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from pathlib import Path

import torch

from deepinfer_sm80.bench import bench_modules
from deepinfer_sm80.testing.bench import Ceilings
from deepinfer_sm80.testing.provenance import provenance


def gpu_slug() -> str:
    return torch.cuda.get_device_name().lower().replace("nvidia ", "").replace(" ", "-")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="*", default=None, help="short module names to run")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: no CUDA GPU here", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    ceilings = Ceilings.measure()
    print(f"copy ceiling {ceilings.as_dict()}")
    failed = 0
    for module_name in bench_modules():
        short = module_name.rsplit(".", 1)[1]
        if args.only and short not in args.only:
            continue
        try:
            module = importlib.import_module(module_name)
            if not hasattr(module, "main"):
                continue
            result = module.main(args.out, ceilings)
        except Exception:
            traceback.print_exc()
            failed += 1
            continue
        payload = {
            "schema": 2,
            "bench": short,
            "provenance": provenance(),
            "ceilings": ceilings.as_dict(),
            "rows": result.pop("rows", []),
            "targets": result.pop("targets", []),
            "results": result,
        }
        path = args.out / f"{short}-{gpu_slug()}.json"
        path.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
