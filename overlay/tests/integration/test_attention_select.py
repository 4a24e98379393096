"""The SM8x layer's startup notes (issue 22 item 8): logged once, at the first layer built."""

from __future__ import annotations

import logging
import types

import pytest

from deepinfer_sm80 import bindings
from deepinfer_sm80.integration import attention_select as sel


@pytest.mark.parametrize(
    ("capability", "level", "combiner", "topk"),
    [(80, "base", True, False), (80, "optimized", False, False), (86, "optimized", False, True),
     (89, "base", True, True)],
)  # fmt: skip
def test_startup_notes(capability: int, level: str, combiner: bool, topk: bool) -> None:
    notes = sel.startup_notes(capability, level)
    assert any("combine_topk_swa_indices" in n for n in notes) is combiner
    assert any("persistent decode top-k" in n for n in notes) is topk
    assert len(notes) == combiner + topk


def test_notes_logged_once_at_first_selection(monkeypatch, caplog) -> None:
    pytest.importorskip("vllm.models.deepseek_v41.attention")
    monkeypatch.setattr(sel, "_NOTED", [])
    monkeypatch.setenv(bindings.ENV_FORCE_CAPABILITY, "86")
    cfg = types.SimpleNamespace(attention_config=types.SimpleNamespace(backend=None))
    select = sel.select_attn_cls(lambda c: None)
    with caplog.at_level(logging.WARNING, logger="deepinfer_sm80"):
        select(cfg)
        select(cfg)
    got = [r.getMessage() for r in caplog.records if r.name == "deepinfer_sm80"]
    assert len(got) == 2 and all(m.startswith("DeepInfer-SM80: ") for m in got)  # base level: both notes
    assert "sm_86" in got[1]
