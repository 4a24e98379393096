import pytest
from hypothesis import given
from hypothesis import strategies as st

from deepinfer_harness.cells import ARRIVALS, KINDS, Cell, format_cell, format_size, parse_cell, parse_size

sizes = st.integers(min_value=1, max_value=2_000_000) | st.integers(1, 2048).map(lambda k: k * 1024)


@st.composite
def cells(draw):
    kind = draw(st.sampled_from(KINDS))
    isl = draw(sizes)
    if kind in ("decode", "greedy"):
        return Cell(kind, isl, draw(sizes), draw(st.integers(1, 64)))
    if kind == "nll":
        return Cell(kind, isl)
    if kind == "chat":
        return Cell(kind, isl, draw(sizes), draw(st.integers(1, 64)))
    if kind == "rate":
        tenths = draw(st.integers(1, 10_000))
        rate = draw(st.sampled_from([tenths / 10, float(tenths), float("inf")]))
        arrival = draw(st.sampled_from(ARRIVALS))
        burstiness = draw(st.sampled_from([0.5, 1.0, 4.0, float("inf")])) if arrival == "gamma" else 0.0
        return Cell(kind, isl, draw(sizes), 1, rate=rate, arrival=arrival, burstiness=burstiness)
    if kind == "prefix":
        isl = max(isl, 2)
        return Cell(kind, isl, draw(sizes), draw(st.integers(1, 64)), prefix=draw(st.integers(1, isl - 1)))
    return Cell(kind, isl, 1, draw(st.integers(1, 64)))


@given(cells())
def test_round_trip(cell):
    assert parse_cell(format_cell(cell)) == cell


@pytest.mark.parametrize(
    "cell_id, cell",
    [
        ("prefill-cold-i64k", Cell("prefill-cold", 65536)),
        ("prefill-cold-i162k-c4", Cell("prefill-cold", 162 * 1024, 1, 4)),
        ("ttft-i1k-c1", Cell("ttft", 1024)),
        ("decode-i1k-o256-c8", Cell("decode", 1024, 256, 8)),
        ("decode-i3000-o512-c12", Cell("decode", 3000, 512, 12)),
        ("nll-i4k", Cell("nll", 4096)),
        ("greedy-i2k-o256-c12", Cell("greedy", 2048, 256, 12)),
        ("rate-i1k-o128-r0p5-poisson", Cell("rate", 1024, 128, 1, rate=0.5, arrival="poisson")),
        ("rate-i1k-o128-rinf-constant", Cell("rate", 1024, 128, 1, rate=float("inf"), arrival="constant")),
        ("prefix-i2k-p1536-o64-c4", Cell("prefix", 2048, 64, 4, prefix=1536)),
        ("chat-i512-o64-c2-wcode", Cell("chat", 512, 64, 2, "code")),
    ],
)
def test_known_ids(cell_id, cell):
    assert parse_cell(cell_id) == cell
    assert format_cell(cell) == cell_id


@pytest.mark.parametrize(
    "bad",
    [
        "prefill-i64k",
        "decode-i1k-c8",
        "nll-i0",
        "decode-i1024-o256-c8",
        "prefill-cold-i64k-c1",
        "ttft-i1k",
        "nll-i4k-c2",
        "",
    ],
)
def test_rejects_bad_or_non_canonical_ids(bad):
    with pytest.raises(ValueError):
        parse_cell(bad)


def test_sizes():
    assert format_size(1024) == "1k"
    assert format_size(1000) == "1000"
    assert parse_size("649k") == 664576
    with pytest.raises(ValueError):
        Cell("prefill-cold", 1024, 2)


def test_new_fields_keep_the_original_kinds_definitions():
    """The rate/arrival/prefix fields are left out of an original kind's definition, so runs
    written before them resume (resume refuses a changed definition sha256)."""
    from deepinfer_harness.plan import CellDef

    old = CellDef(Cell("decode", 64, 32, 4)).definition()
    assert set(old["cell"]) == {"kind", "isl", "osl", "concurrency", "workload"}
    new = CellDef(Cell("rate", 64, 32, 1, rate=2.0, arrival="poisson")).definition()
    assert new["cell"]["rate"] == 2.0 and new["cell"]["arrival"] == "poisson"
