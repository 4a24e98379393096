import itertools

from hypothesis import given
from hypothesis import strategies as st

from deepinfer_harness.run.sse import SSESplitter

STREAM = (
    b': keep-alive comment\n\ndata: {"a":1}\n\ndata:{"b":2}\r\n\r\n'
    b"event: x\ndata: line1\ndata: line2\n\ndata: [DONE]\n\n"
)
EXPECTED = [b'{"a":1}', b'{"b":2}', b"line1\nline2", b"[DONE]"]


def split_all(chunks):
    s = SSESplitter()
    out = []
    for c in chunks:
        out += s.feed(c)
    return out + s.finish()


def test_whole_stream():
    assert split_all([STREAM]) == EXPECTED


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts):
    cuts = sorted(set(cuts))
    edges = [0, *cuts, len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(edges)]
    assert split_all(chunks) == EXPECTED


def test_final_event_without_blank_line():
    assert split_all([b"data: 1\n\ndata: 2"]) == [b"1", b"2"]


def test_huge_single_line_event_is_linear():
    payload = b"[" + b",".join(b"123456" for _ in range(700_000)) + b"]"  # ~5 MB, one line
    chunks = [b"data: "] + [payload[i : i + 65536] for i in range(0, len(payload), 65536)] + [b"\n\n"]
    assert split_all(chunks) == [payload]
