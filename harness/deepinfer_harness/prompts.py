"""Token-id prompts built once per workload (workloads.py), so both arms get identical bytes.

Each workload's text is tokenized by the first server (`/tokenize`), stored with its sha256 under
the run directory, and cut into windows: a prompt is `isl` consecutive ids, never a tiling, so no
text repeats inside a prompt (repeats inflate speculative acceptance and lower NLL). Later sessions
re-tokenize a canary and refuse to run if the ids drifted. `corpus_text` (the bundled page) stays
the tokenizer-training text of the tiny models.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

CANARY = "The keeper wrote the same line in his logbook every evening."


def corpus_text() -> str:
    return resources.files("deepinfer_harness").joinpath("data/corpus.txt").read_text()


def sha256_ids(ids: list[int]) -> str:
    return hashlib.sha256(json.dumps(ids, separators=(",", ":")).encode()).hexdigest()


@dataclass(frozen=True)
class TokenCorpus:
    """Corpus token ids (`ids`) and the canary's ids as the tokenizer produced them."""

    ids: list[int]
    canary_ids: list[int]
    text_sha256: str
    workload: str = "prose"
    source: str = ""

    @property
    def sha256(self) -> str:
        return sha256_ids(self.ids)

    def prompt(self, isl: int, index: int, stride: int = 97) -> list[int]:
        """`isl` consecutive ids: prompt `index` starts `index * isl` ids in (disjoint windows while
        the text lasts), wrapping over the possible starts with an extra `index * stride` shift so
        prompts stay distinct once windows must overlap. Never repeats text inside a prompt."""
        n = len(self.ids)
        if isl > n:
            raise ValueError(f"workload {self.workload} has {n} tokens, fewer than a prompt of {isl}")
        starts = n - isl + 1
        start = (index * isl + (index * isl // starts) * stride) % starts
        return self.ids[start : start + isl]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "ids": self.ids,
            "canary_ids": self.canary_ids,
            "text_sha256": self.text_sha256,
            "ids_sha256": self.sha256,
            "workload": self.workload,
            "source": self.source,
        }
        path.write_text(json.dumps(payload))

    @classmethod
    def load(cls, path: Path) -> TokenCorpus:
        data = json.loads(path.read_text())
        corpus = cls(
            ids=data["ids"],
            canary_ids=data["canary_ids"],
            text_sha256=data["text_sha256"],
            workload=data.get("workload", "page"),
            source=data.get("source", ""),
        )
        if corpus.sha256 != data["ids_sha256"]:
            raise ValueError(f"{path}: stored ids do not match their sha256")
        return corpus


def text_sha256() -> str:
    return hashlib.sha256(corpus_text().encode()).hexdigest()
