"""Incremental Server-Sent-Events splitter over raw byte chunks (no line-length limit).

Events end at a blank line (LF or CRLF); `data:` is accepted with or without a space, several
data lines join with "\\n", `:` comment lines and other fields are skipped, and a final event
without a trailing blank line is returned by `finish()`. A 5 MB single-line event costs one
linear scan: the search resumes where the previous one stopped.
"""

from __future__ import annotations

_SEPARATORS = (b"\n\n", b"\r\n\r\n")


def _payload(block: bytes) -> bytes | None:
    data: list[bytes] = []
    for line in block.split(b"\n"):
        line = line.rstrip(b"\r")
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


class SSESplitter:
    def __init__(self) -> None:
        self._buf = bytearray()
        self._scan = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        """Append bytes; return the data payloads of every event completed by them."""
        self._buf += chunk
        out: list[bytes] = []
        while True:
            cut, sep_len = -1, 0
            for sep in _SEPARATORS:
                pos = self._buf.find(sep, self._scan)
                if pos != -1 and (cut == -1 or pos < cut):
                    cut, sep_len = pos, len(sep)
            if cut == -1:
                self._scan = max(0, len(self._buf) - 3)
                return out
            block = bytes(self._buf[:cut])
            del self._buf[: cut + sep_len]
            self._scan = 0
            payload = _payload(block)
            if payload is not None:
                out.append(payload)

    def finish(self) -> list[bytes]:
        """Payload of a trailing event that had no blank line after it (if any)."""
        block, self._buf, self._scan = bytes(self._buf), bytearray(), 0
        payload = _payload(block) if block.strip() else None
        return [payload] if payload is not None else []
