"""Issue 23 defect 1: a run interrupted at any stage and resumed reaches the verdict of a run that
was never interrupted (session provenance is written as each session starts, atomically)."""

import pytest

from deepinfer_harness.analysis import report
from deepinfer_harness.layout import RunLayout, read_json
from deepinfer_harness.run import sessions

from .test_first_day import SMALL
from .test_pipeline_fake import bench, write_profile


def verdict(root):
    summary, manifest = read_json(root / "summary.json"), read_json(root / "manifest.json")
    rows = read_json(root / "ab.json")["rows"]
    return {
        "parity": manifest["parity"]["status"],
        "diffs": manifest["parity"]["diffs"],
        "sessions": sorted(manifest["sessions"]),
        "marks": summary["marks"],
        "not_comparable": [r["why"] for r in rows if r["mark"] == "x"],
        "n_runs": summary["n_runs"],
        "n_invalid": summary["n_invalid"],
        "missing": summary["missing_runs"],
        "variants": sorted(summary["provenance"]["variants"]),
    }


def interrupt_on_call(monkeypatch, module, name, call):
    real, calls = getattr(module, name), []

    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapped)


# (function, n-th call that is interrupted): before a session's provenance is known (collect),
# inside a cell before its summary is written (save, 1st..4th run), and after every run (report)
STAGES = [
    (sessions, "collect_variant", 1),
    (sessions, "collect_variant", 3),
    (sessions, "_save_cell", 1),
    (sessions, "_save_cell", 2),
    (sessions, "_save_cell", 4),
    (report, "build_report", 1),
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, fake_server):
    fake_server.configure()
    tmp = tmp_path_factory.mktemp("ref")
    assert bench(tmp, write_profile(tmp, fake_server.url, plan=SMALL), "--no-charts") == 0
    return verdict(RunLayout(tmp / "results" / "fake").root)


@pytest.mark.parametrize(("module", "name", "call"), STAGES, ids=[f"{n}-{c}" for _, n, c in STAGES])
def test_interrupted_then_resumed_gives_the_uninterrupted_verdict(
    fake, tmp_path, monkeypatch, reference, module, name, call
):
    profile = write_profile(tmp_path, fake.url, plan=SMALL)
    with monkeypatch.context() as m:
        interrupt_on_call(m, module, name, call)
        assert bench(tmp_path, profile, "--no-charts") == 130
    root = RunLayout(tmp_path / "results" / "fake").root
    assert bench(tmp_path, profile, "--no-charts") == 0
    got = verdict(root)
    assert got == reference
    assert got["parity"] == "ok" and not got["not_comparable"]


def test_a_checkpoint_rebuilt_mid_run_is_caught(tmp_path):
    """A checkpoint rewritten between sessions (e.g. `make tiny-model` with a new recipe while a
    run is on) fails parity, and a resume of such a run is refused."""
    import json
    import os

    from deepinfer_harness.manifest import DefinitionMismatch, init_manifest, model_fingerprint
    from deepinfer_harness.parity import certificate

    from .conftest import write_checkpoint

    model = write_checkpoint(tmp_path / "m")
    before = model_fingerprint(model)
    cfg = tmp_path / "m" / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 513}))
    os.utime(cfg, ns=(1, 1))
    after = model_fingerprint(model)
    assert before != after and model_fingerprint("org/name") is None
    a = {"variant": "A", "rep": 0, "model_fingerprint": before}
    b = {"variant": "B", "rep": 0, "model_fingerprint": after}
    assert any("model_fingerprint" in d for d in certificate({"0": a, "1": b}, set())["diffs"])
    layout = RunLayout(tmp_path / "run")
    layout.root.mkdir()
    layout.manifest.write_text(json.dumps({"cells": [], "model": model, "model_fingerprint": before}))
    with pytest.raises(DefinitionMismatch, match="changed since the run began"):
        init_manifest(layout, None, [], [], "run", model, None)
