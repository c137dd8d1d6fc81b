"""Preemptible-GPU availability: Bamboo event traces, plain count CSVs, and the paper's segments.

Two input formats:

- Bamboo's event log (``t_ms,add|remove,nodeN``, no header): the number of instances available at
  time t is adds minus removes with ``t_ms <= t``. Segments map it to 0-12 preemptible GPUs by the
  recipe of ``traces/SEGMENTS.md``: sample each minute, ``2 * round(6 n / C)`` (even, for TP2
  workers) or ``round(12 n / C)`` (per GPU), C the trace's peak instance count.
- A plain CSV with header ``t_s,gpus``: from each ``t_s`` on, ``gpus`` preemptible GPUs are
  available (already 0-12; odd counts leave one GPU without a TP2 partner).

:class:`Availability` is the resulting step function of preemptible GPUs over simulated seconds,
starting at 0; ``cut`` takes a window of any trace.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from pearl.core.errors import ConfigError

MAX_PREEMPTIBLE = 12
RESERVED_ROLLOUT_GPUS = 4


@dataclass(frozen=True)
class Segment:
    """One of the paper's two-hour segments (§6.1, Figure 4) as SEGMENTS.md defines it."""

    name: str
    file: str
    start_min: int  # even-count mapping (TP2)
    start_min_per_gpu: int  # per-GPU mapping (TP1)
    mean_rollout_gpus: float  # the paper's figure
    roll_large_gpus: int  # ROLL-Large's fixed pool: the mean rounded up to a multiple of 2


SEGMENTS: dict[str, Segment] = {
    "S1": Segment(
        name="S1",
        file="p3-trace.csv",
        start_min=350,
        start_min_per_gpu=362,
        mean_rollout_gpus=13.6,
        roll_large_gpus=14,
    ),
    "S2": Segment(
        name="S2",
        file="g4dn-trace.csv",
        start_min=176,
        start_min_per_gpu=147,
        mean_rollout_gpus=9.0,
        roll_large_gpus=10,
    ),
    "S3": Segment(
        name="S3",
        file="g4dn-trace.csv",
        start_min=394,
        start_min_per_gpu=393,
        mean_rollout_gpus=11.8,
        roll_large_gpus=12,
    ),
}
SEGMENT_MINUTES = 120
OPEN_END_S = 366 * 86400.0  # a count CSV's last row holds this long


@dataclass(frozen=True)
class Availability:
    """Preemptible GPUs available from ``times[i]`` (seconds) until the next time."""

    times: tuple[float, ...]
    gpus: tuple[int, ...]
    duration_s: float
    source: str = ""

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.gpus):
            raise ConfigError("an availability trace needs at least one (time, gpus) point")
        if self.times[0] != 0.0 or list(self.times) != sorted(self.times):
            raise ConfigError("availability times must start at 0 and increase")
        if any(g < 0 for g in self.gpus):
            raise ConfigError("availability counts must be >= 0")

    def at(self, t: float) -> int:
        """Preemptible GPUs available at time t."""
        return self.gpus[max(0, bisect.bisect_right(self.times, t) - 1)]

    def changes(self) -> list[tuple[float, int]]:
        """(time, new count) at each change after time 0, within the duration."""
        out = []
        for t, g, prev in zip(self.times[1:], self.gpus[1:], self.gpus, strict=False):
            if g != prev and t < self.duration_s:
                out.append((t, g))
        return out

    def mean(self) -> float:
        """Time-weighted mean of preemptible GPUs over the duration."""
        total = 0.0
        ends = [*self.times[1:], self.duration_s]
        for t, end, g in zip(self.times, ends, self.gpus, strict=True):
            total += g * max(0.0, min(end, self.duration_s) - t)
        return total / self.duration_s if self.duration_s > 0 else float(self.gpus[0])

    def cut(self, start_s: float, duration_s: float) -> Availability:
        """The window [start_s, start_s + duration_s), shifted to start at 0."""
        if start_s < 0 or duration_s <= 0:
            raise ConfigError(f"bad trace window: start {start_s} s, duration {duration_s} s")
        times, gpus = [0.0], [self.at(start_s)]
        for t, g in zip(self.times, self.gpus, strict=True):
            if start_s < t < start_s + duration_s and g != gpus[-1]:
                times.append(t - start_s)
                gpus.append(g)
        return Availability(
            times=tuple(times), gpus=tuple(gpus), duration_s=duration_s, source=self.source
        )

    @staticmethod
    def constant(gpus: int, duration_s: float) -> Availability:
        return Availability(
            times=(0.0,), gpus=(gpus,), duration_s=duration_s, source=f"constant {gpus}"
        )


# -- Bamboo event traces --------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceTrace:
    """A Bamboo trace as instance counts: ``counts[i]`` instances from ``times_ms[i]`` on."""

    times_ms: tuple[int, ...]
    counts: tuple[int, ...]
    source: str

    @property
    def peak(self) -> int:
        return max(self.counts)

    def at_ms(self, t_ms: float) -> int:
        i = bisect.bisect_right(self.times_ms, t_ms) - 1
        return self.counts[i] if i >= 0 else 0

    def per_minute(self, start_min: int, minutes: int) -> list[int]:
        """Instances available at each whole minute (events with t_ms <= t count)."""
        return [self.at_ms((start_min + m) * 60_000) for m in range(minutes)]

    @property
    def minutes(self) -> int:
        return self.times_ms[-1] // 60_000 + 1


def parse_bamboo(text: str, source: str = "trace") -> InstanceTrace:
    """Parse ``t_ms,add|remove,nodeN`` lines (CRLF or LF) into instance counts."""
    deltas: dict[int, int] = {}
    live: set[str] = set()
    rows = [line.strip() for line in text.splitlines() if line.strip()]
    if not rows:
        raise ConfigError(f"{source}: the trace is empty")
    for i, line in enumerate(rows, 1):
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or parts[1] not in ("add", "remove"):
            raise ConfigError(f"{source}:{i}: expected 't_ms,add|remove,nodeN', got {line!r}")
        try:
            t = int(parts[0])
        except ValueError:
            raise ConfigError(f"{source}:{i}: time {parts[0]!r} is not an integer (ms)") from None
        node = parts[2]
        if parts[1] == "add":
            if node in live:
                raise ConfigError(f"{source}:{i}: {node} added twice")
            live.add(node)
            deltas[t] = deltas.get(t, 0) + 1
        else:
            if node not in live:
                raise ConfigError(f"{source}:{i}: {node} removed but never added")
            live.discard(node)
            deltas[t] = deltas.get(t, 0) - 1
    times, counts, n = [], [], 0
    for t in sorted(deltas):
        n += deltas[t]
        times.append(t)
        counts.append(n)
    return InstanceTrace(tuple(times), tuple(counts), source)


# Python's round (half to even) is what reproduces every statistic of SEGMENTS.md; rounding
# half up would give S2 a mean of 9.52 GPUs and 12 changes instead of 9.00 and 9.


def map_even(n: int, peak: int) -> int:
    """SEGMENTS.md, TP2: preemptible GPUs = 2 * round(6 n / C)."""
    return 2 * round(MAX_PREEMPTIBLE / 2 * n / peak)


def map_per_gpu(n: int, peak: int) -> int:
    """SEGMENTS.md, TP1: preemptible GPUs = round(12 n / C)."""
    return round(MAX_PREEMPTIBLE * n / peak)


def from_instances(
    trace: InstanceTrace, start_min: int, minutes: int, even: bool = True
) -> Availability:
    """Sample each minute, map to 0-12 preemptible GPUs, keep ``minutes`` from ``start_min``."""
    if start_min < 0 or minutes <= 0:
        raise ConfigError(f"bad window: start minute {start_min}, {minutes} minutes")
    if start_min >= trace.minutes:
        raise ConfigError(
            f"{trace.source}: start minute {start_min} is past the end of the trace "
            f"({trace.minutes} minutes)"
        )
    mapper = map_even if even else map_per_gpu
    samples = [mapper(n, trace.peak) for n in trace.per_minute(start_min, minutes)]
    times, gpus = [0.0], [samples[0]]
    for m, g in enumerate(samples[1:], 1):
        if g != gpus[-1]:
            times.append(60.0 * m)
            gpus.append(g)
    return Availability(
        times=tuple(times), gpus=tuple(gpus), duration_s=60.0 * minutes, source=trace.source
    )


# -- plain count CSVs ------------------------------------------------------------------------------


def parse_counts(text: str, source: str = "trace") -> Availability:
    """A ``t_s,gpus`` CSV: from each t_s on, gpus preemptible GPUs (0-12) are available."""
    rows = list(csv.reader(line for line in text.splitlines() if line.strip()))
    if not rows or [c.strip() for c in rows[0]] != ["t_s", "gpus"]:
        raise ConfigError(f"{source}: a count trace starts with the header 't_s,gpus'")
    pts: list[tuple[float, int]] = []
    for i, row in enumerate(rows[1:], 2):
        try:
            t, g = float(row[0]), int(row[1])
        except (ValueError, IndexError):
            raise ConfigError(f"{source}:{i}: expected 't_s,gpus' numbers, got {row}") from None
        if not 0 <= g <= MAX_PREEMPTIBLE or t < 0 or not math.isfinite(t):
            raise ConfigError(f"{source}:{i}: need t_s >= 0 and 0 <= gpus <= {MAX_PREEMPTIBLE}")
        if pts and t <= pts[-1][0]:
            raise ConfigError(f"{source}:{i}: times must increase")
        pts.append((t, g))
    if not pts:
        raise ConfigError(f"{source}: no rows after the header")
    if pts[0][0] > 0:
        pts.insert(0, (0.0, 0))
    # The last count holds from its time on: the trace covers as much as a window asks for.
    end = pts[-1][0] + OPEN_END_S
    return Availability(
        times=tuple(p[0] for p in pts), gpus=tuple(p[1] for p in pts), duration_s=end, source=source
    )


# -- loading -------------------------------------------------------------------------------------


def packaged(name: str) -> Path:
    """Path of a trace shipped with pearl.sim (the Bamboo CSVs, MIT; see traces/SOURCES.md)."""
    return Path(str(resources.files("pearl.sim").joinpath("traces", name)))


def read_text(path: str | Path) -> str:
    p = Path(path)
    try:
        return p.read_text()
    except FileNotFoundError:
        raise ConfigError(f"trace file {p} does not exist") from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as e:
        raise ConfigError(f"cannot read trace file {p}: {e}") from None


def is_count_csv(text: str) -> bool:
    first = next((line for line in text.splitlines() if line.strip()), "")
    return first.replace(" ", "").lower().startswith("t_s,")


def segment(name: str) -> Segment:
    key = name.upper()
    if key not in SEGMENTS:
        raise ConfigError(f"unknown segment {name!r} (known: {', '.join(SEGMENTS)})")
    return SEGMENTS[key]


def load(
    path: str | Path | None = None,
    *,
    segment_name: str | None = None,
    start_min: float | None = None,
    minutes: float | None = None,
    even: bool = True,
) -> Availability:
    """The availability window a simulation replays.

    ``segment_name`` picks S1-S3 (its trace file when ``path`` is None, its start minute);
    ``start_min``/``minutes`` cut any trace (Bamboo traces are sampled each minute).
    """
    seg = segment(segment_name) if segment_name else None
    if seg is not None and start_min is not None:
        raise ConfigError("give either --segment or --start-min, not both")
    if path is None:
        if seg is None:
            raise ConfigError("no trace: give --trace FILE or --segment S1|S2|S3")
        path = packaged(seg.file)
    text = read_text(path)
    span = float(minutes) if minutes is not None else float(SEGMENT_MINUTES)
    if span <= 0:
        raise ConfigError(f"--minutes must be > 0, got {minutes}")
    if is_count_csv(text):
        if seg is not None:
            raise ConfigError(
                "segments S1-S3 are defined on Bamboo event traces, not count CSVs; "
                "use --start-min/--minutes"
            )
        avail = parse_counts(text, str(path))
        start = 60.0 * (start_min or 0.0)
        if start < 0:
            raise ConfigError(f"--start-min must be >= 0, got {start_min}")
        return avail.cut(start, 60.0 * span)
    trace = parse_bamboo(text, str(path))
    if seg is not None:
        first = seg.start_min if even else seg.start_min_per_gpu
    else:
        first = int(start_min or 0)
    if start_min is not None and start_min != int(start_min):
        raise ConfigError("--start-min must be a whole minute for Bamboo traces")
    return from_instances(trace=trace, start_min=first, minutes=int(math.ceil(span)), even=even)


__all__ = [
    "MAX_PREEMPTIBLE",
    "RESERVED_ROLLOUT_GPUS",
    "SEGMENTS",
    "SEGMENT_MINUTES",
    "Availability",
    "InstanceTrace",
    "Segment",
    "from_instances",
    "load",
    "map_even",
    "map_per_gpu",
    "packaged",
    "parse_bamboo",
    "parse_counts",
    "segment",
]
