"""Prometheus /metrics snapshots: exact names, summed over `engine`, `_created` kept apart.

A snapshot maps `name{label=value,…}` (labels sorted, `engine` and `model_name` dropped) to a
float. Deltas between two snapshots are only meaningful if no counter went down and no
`_created` timestamp changed; `restart_evidence` lists what says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_DROP_LABELS = ("engine", "model_name")

# vLLM 0.32.0's speculative-decoding counters (v1/spec_decode/metrics.py, SpecDecodingProm; a
# prometheus_client Counter is exposed with `_total`): one draft is one proposal of K tokens,
# accepted tokens are the drafted tokens the verifier kept, per position with label `position`
# (0 … K − 1). Deltas over a run give its acceptance length 1 + accepted/drafts and rate
# accepted/draft tokens (run_summary.spec_decode).
SPEC_DRAFTS = "vllm:spec_decode_num_drafts_total"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_DECODE_COUNTERS = (SPEC_DRAFTS, SPEC_DRAFT_TOKENS, SPEC_ACCEPTED, SPEC_ACCEPTED_PER_POS)


def _key(name: str, labels: dict[str, str]) -> str:
    kept = sorted((k, v) for k, v in labels.items() if k not in _DROP_LABELS)
    return name + ("{" + ",".join(f"{k}={v}" for k, v in kept) + "}" if kept else "")


@dataclass
class Snapshot:
    values: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)  # raw keys incl. engine: restart check
    info: dict[str, dict[str, str]] = field(default_factory=dict)  # *_info gauges: labels

    def get(self, key: str, default: float = 0.0) -> float:
        return self.values.get(key, default)

    def total(self, name: str, **labels: str) -> float:
        """Sum of every series of `name` whose labels include `labels`."""
        out = 0.0
        for key, value in self.values.items():
            base, _, rest = key.partition("{")
            if base != name:
                continue
            pairs = dict(p.split("=", 1) for p in rest.rstrip("}").split(",") if p) if rest else {}
            if all(pairs.get(k) == v for k, v in labels.items()):
                out += value
        return out


def parse_metrics(text: str) -> Snapshot:
    snap = Snapshot()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            if name.endswith("_created"):
                raw = name + "{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}"
                snap.created[raw] = value
                continue
            if name.endswith("_info"):
                snap.info[name] = {k: v for k, v in labels.items() if k != "engine"}
            key = _key(name, labels)
            snap.values[key] = snap.values.get(key, 0.0) + value
    return snap


def delta(before: Snapshot, after: Snapshot) -> dict[str, float]:
    """after − before for every series present in both."""
    return {k: after.values[k] - v for k, v in before.values.items() if k in after.values}


def restart_evidence(
    before: Snapshot, after: Snapshot, counter_suffixes: tuple[str, ...] = ("_total", "_count", "_sum")
) -> list[str]:
    evidence = []
    for key, value in before.created.items():
        if key in after.created and after.created[key] != value:
            evidence.append(f"{key} changed {value} -> {after.created[key]}")
            break
    for key, value in before.values.items():
        base = key.partition("{")[0]
        if base.endswith(counter_suffixes) and key in after.values and after.values[key] < value:
            evidence.append(f"counter {key} went down {value} -> {after.values[key]}")
            break
    if before.values and after.values and not (set(before.values) & set(after.values)):
        evidence.append("no common series between snapshots")
    return evidence
