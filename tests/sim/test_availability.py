"""Trace parsing and the paper's segments (traces/SEGMENTS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pearl.core.errors import ConfigError
from pearl.sim import availability as av

# SEGMENTS.md: (mean rollout GPUs, count changes) for the even (TP2) and per-GPU mappings.
EVEN = {"S1": (13.60, 14), "S2": (9.00, 9), "S3": (11.80, 1)}
PER_GPU = {"S1": (13.72, 15, 11, 16), "S2": (8.87, 22, 5, 11), "S3": (11.79, 4, 10, 13)}


@pytest.mark.parametrize("name", sorted(EVEN))
def test_even_segments_reproduce_segments_md(name: str) -> None:
    a = av.load(segment_name=name)
    mean, changes = EVEN[name]
    assert av.RESERVED_ROLLOUT_GPUS + a.mean() == pytest.approx(mean, abs=0.005)
    assert len(a.changes()) == changes
    assert a.duration_s == 7200.0
    assert all(g % 2 == 0 and 0 <= g <= 12 for g in a.gpus)


@pytest.mark.parametrize("name", sorted(PER_GPU))
def test_per_gpu_segments_reproduce_segments_md(name: str) -> None:
    a = av.load(segment_name=name, even=False)
    mean, changes, lo, hi = PER_GPU[name]
    assert 4 + a.mean() == pytest.approx(mean, abs=0.005)
    assert len(a.changes()) == changes
    assert (4 + min(a.gpus), 4 + max(a.gpus)) == (lo, hi)


def test_bamboo_trace_statistics_match_sources_md() -> None:
    p3 = av.parse_bamboo(av.packaged("p3-trace.csv").read_text())
    g4 = av.parse_bamboo(av.packaged("g4dn-trace.csv").read_text())
    assert (min(p3.counts), p3.peak) == (10, 32)
    assert (p3.counts[0], p3.at_ms(25 * 60_000)) == (18, 32)
    assert g4.peak == 24 and g4.at_ms(7 * 60_000) == 0 and g4.at_ms(8 * 60_000) == 1
    assert len(p3.counts) <= 344 and p3.times_ms[-1] == 682 * 60_000


def test_packaged_traces_carry_their_license() -> None:
    text = av.packaged("SOURCES.md").read_text()
    assert "MIT License" in text and "Copyright (c) 2022 UCLASystem" in text


def test_count_csv_and_cut(tmp_path: Path) -> None:
    f = tmp_path / "t.csv"
    f.write_text("t_s,gpus\n0,4\n600,7\n1200,12\n")
    a = av.load(f)
    assert a.at(0) == 4 and a.at(700) == 7 and a.at(5000) == 12
    assert a.duration_s == 7200.0  # the default window: 120 minutes
    w = av.load(f, start_min=5, minutes=10)
    assert w.gpus == (4, 7) and w.times == (0.0, 300.0) and w.duration_s == 600.0


def test_bamboo_window_by_start_minute() -> None:
    a = av.load(av.packaged("g4dn-trace.csv"), start_min=176, minutes=120)
    assert a == av.load(segment_name="S2")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("t_s,gpus\n0,13\n", "0 <= gpus <= 12"),
        ("t_s,gpus\n0,1\n0,2\n", "increase"),
        ("0,add,node1\n60000,remove,node2\n", "never added"),
        ("0,plus,node1\n", "add\\|remove"),
        ("", "empty"),
    ],
)
def test_bad_traces_are_clear_errors(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        av.load(f, start_min=0)


def test_bad_segment_and_missing_file() -> None:
    with pytest.raises(ConfigError, match="unknown segment"):
        av.load(segment_name="S9")
    with pytest.raises(ConfigError, match="does not exist"):
        av.load("/nonexistent/trace.csv")
    with pytest.raises(ConfigError, match="either --segment or --start-min"):
        av.load(segment_name="S1", start_min=3)
