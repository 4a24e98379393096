"""Token-id prompts built once from the bundled natural-text corpus, so both arms get identical bytes.

The corpus is tokenized by the first server (`/tokenize`), stored with its sha256 under the run
directory, and tiled with a per-prompt rotation to any ISL; later sessions re-tokenize a canary
and refuse to run if the ids drifted.
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

    @property
    def sha256(self) -> str:
        return sha256_ids(self.ids)

    def prompt(self, isl: int, index: int, stride: int = 97) -> list[int]:
        """ISL ids starting `index * stride` tokens into the tiled corpus: distinct per index."""
        n = len(self.ids)
        start = (index * stride) % n
        reps = (start + isl) // n + 1
        tiled = self.ids * reps
        return tiled[start : start + isl]

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "ids": self.ids,
            "canary_ids": self.canary_ids,
            "text_sha256": self.text_sha256,
            "ids_sha256": self.sha256,
        }
        path.write_text(json.dumps(payload))

    @classmethod
    def load(cls, path: Path) -> TokenCorpus:
        data = json.loads(path.read_text())
        corpus = cls(ids=data["ids"], canary_ids=data["canary_ids"], text_sha256=data["text_sha256"])
        if corpus.sha256 != data["ids_sha256"]:
            raise ValueError(f"{path}: stored ids do not match their sha256")
        return corpus


def text_sha256() -> str:
    return hashlib.sha256(corpus_text().encode()).hexdigest()
