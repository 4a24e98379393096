"""`ray status` read once for every caller: the nodes up and each resource's use.

Ray's autoscaler status (2.56) lists its nodes under `Active:` and `Idle:` (a node with no work is
idle, and idle nodes are up: a fresh cluster before `vllm serve` shows all of its nodes there), one
` <count> node_<id>` line each, and each resource under `Total Usage:` as ` <used>/<total> <name>`
(memory sizes, `0B/3.72GiB memory`, are not resources here). `make validate` reads a cluster through
it, and so does the e2e Ray rehearsal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NODE_BLOCKS = ("Active", "Idle")
_NODE = re.compile(r"(\d+)\s+node_\S*$")
_USAGE = re.compile(r"([\d.]+)\s*/\s*([\d.]+)\s+(\w+)\b")


@dataclass
class RayStatus:
    nodes_up: int | None = None  # None: no node block in the text
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)  # resource -> (used, total)


def parse(text: str) -> RayStatus:
    out = RayStatus()
    section = ""
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":") and not s[0].isdigit():
            section = s[:-1]
            if section in NODE_BLOCKS and out.nodes_up is None:
                out.nodes_up = 0
            continue
        if section in NODE_BLOCKS and out.nodes_up is not None and (m := _NODE.match(s)):
            out.nodes_up += int(m.group(1))
        elif section == "Total Usage" and (m := _USAGE.match(s)):
            out.usage[m.group(3)] = (float(m.group(1)), float(m.group(2)))
    return out
