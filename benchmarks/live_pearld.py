"""The storm and chaos runs around a live pearld (pearl.testing.pearld, on a loopback port):
a trainer that remembers what pearld acknowledged, and the checks that compare it with the log.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pearl.core import events as ev  # noqa: E402
from pearl.core.status import status_plain  # noqa: E402
from pearl.testing.pearld import CONFIG, Host, Pearld, alive, free_port  # noqa: E402
from pearl.testing.wait import poll  # noqa: E402
from transports.protocol import Event, StatusRequest  # noqa: E402
from transports.rpc import RemoteError  # noqa: E402

PREEMPTIBLE = tuple(range(20, 32))


class Trainer:
    """The Python client (``pearl.connect``) with every acknowledged event remembered."""

    def __init__(self, endpoint: str, timeout_s: float = 5.0) -> None:
        import pearl

        self.rt = pearl.connect(endpoint, timeout_s=timeout_s)
        self.acked: dict[int, Any] = {}  # seq -> record, as acknowledged
        self.refused: dict[str, int] = {}
        self.unacked = 0  # sent, no reply: may or may not be logged
        self.told_failed: list[Any] = []  # records pearld answered with an error: not logged
        self.unknown: list[Any] = []  # records sent with no answer: logged or not
        self.last_refusal = ""  # the error text of the last refusal

    def close(self) -> None:
        self.rt.stop()

    def status(self, timeout_s: float = 2.0) -> dict[str, Any]:
        """The status view; one try (a dead pearld must not stall the caller for long)."""
        payload = self.rt.client.request(StatusRequest(), timeout_s, retries=0).payload
        if not payload:
            raise RuntimeError("pearld has not published its state yet")
        return status_plain(payload)

    def publish(self, version: int, data: bytes, timeout_s: float = 10.0) -> bool:
        """Upload weights ``version`` (pearld stores them and logs weights-published)."""
        from actors.messages import WeightsUpload

        try:
            self.rt.client.request(
                WeightsUpload(version=version), timeout_s, retries=0, frames=(data,)
            )
        except Exception:
            return False
        return True

    def event(self, record: Any, timeout_s: float = 5.0) -> int | None:
        """Send ``record``; its sequence number once acknowledged, None when refused or not
        answered. No retry: a retry that crosses a pearld restart could be logged twice."""
        self.last_refusal = ""
        try:
            seq = int(self.rt.client.request(Event.of(record), timeout_s, retries=0).seq)
        except RemoteError as e:
            self.last_refusal = str(e)
            why = str(e).split(":", 2)[-1].strip()[:80]
            self.refused[why] = self.refused.get(why, 0) + 1
            self.told_failed.append(record)
            return None
        except Exception:
            self.unacked += 1
            self.unknown.append(record)
            return None
        self.acked[seq] = record
        return seq

    def reported_failed_but_durable(self, state: Path) -> list[str]:
        """Logged records of the kinds this client sends that pearld did not acknowledge and
        that no unanswered attempt explains: each was answered with an error, yet happened."""
        kinds = (ev.GpusAdded, ev.GpusReclaimed, ev.TrainingBegin, ev.TrainingFinished)
        unknown = list(self.unknown)
        out = []
        for seq, r in read_log(state):
            if seq in self.acked or not isinstance(r, kinds):
                continue
            if r in unknown:
                unknown.remove(r)  # sent with no answer: may well be logged
            elif r in self.told_failed:
                out.append(f"seq {seq}: {r}")
        return out

    def wait_proceed(self, step: int, timeout: float) -> float | None:
        """Seconds from now until status says training step ``step`` may proceed."""
        t0 = time.monotonic()

        def ok() -> bool:
            try:
                return bool(self.status()["training_may_proceed"] >= step)
            except Exception:
                return False

        return time.monotonic() - t0 if poll(ok, timeout, 0.005) else None


def safetensors_blob() -> bytes:
    """A one-tensor safetensors file (sim engines only look at the version)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    return len(header).to_bytes(8, "little") + header + b"\0\0\0\0"


def read_log(state: Path) -> list[tuple[int, Any]]:
    from pearl.log import FileLog

    with FileLog(state / "log", readonly=True) as log:
        return list(log.read())


def lost_events(state: Path, acked: dict[int, Any], published: set[int]) -> list[str]:
    """Acknowledged events (and uploaded weight versions) that the log does not hold."""
    logged = dict(read_log(state))
    lost = [f"seq {s}: {r}" for s, r in sorted(acked.items()) if logged.get(s) != r]
    versions = {r.version for r in logged.values() if isinstance(r, ev.WeightsPublished)}
    return lost + [f"weights v{v}" for v in sorted(published - versions)]


def pearl_cli(*args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """``pearl ARGS...`` as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pearl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def pearl_json(*args: str) -> dict[str, Any]:
    out = pearl_cli(*args)
    if out.returncode:
        raise RuntimeError(f"pearl {' '.join(args)}: {out.stderr.strip()}")
    return dict(json.loads(out.stdout))


def status_vs_replay(d: Pearld, tries: int = 10) -> tuple[bool, dict[str, Any]]:
    """``pearl status --json`` against ``pearl log replay DIR --until SEQ --json`` for the same
    sequence number: equal on every key the replay has."""
    diff: dict[str, Any] = {}
    for _ in range(tries):
        s = pearl_json("status", "--json", "--endpoint", d.endpoint)
        r = pearl_json("log", "replay", str(d.state), "--until", str(s["seq"]), "--json")
        diff = {k: {"status": s.get(k), "replay": v} for k, v in r.items() if s.get(k) != v}
        if not diff:
            return True, {}
        time.sleep(0.5)
    return False, diff


def summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0, "median_s": 0.0, "max_s": 0.0}
    return {"n": len(xs), "median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3)}


def overlap_serving(s: dict[str, Any]) -> bool:
    """An overlap worker (on a lent training GPU) is active: borrowing is under way."""
    return any(
        w["zone"] == "overlap" and w["role"] != "training" and w["activity"] == "active"
        for w in s["workers"]
    )


def parser(doc: str) -> argparse.ArgumentParser:
    """The flags storm and chaos share: --seed, --json, --set K=V (repeatable), --keep DIR."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="K=V",
        help="pearld config override (repeatable)",
    )
    ap.add_argument("--keep", help="keep pearld's state dir and logs here (default: a temp dir)")
    return ap


def in_state_dir(
    args: argparse.Namespace, prefix: str, run: Callable[[argparse.Namespace, Path], Any]
) -> Any:
    """``run(args, dir)`` in ``--keep DIR`` or in a temporary directory removed afterwards."""
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
        return run(args, Path(args.keep))
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run(args, Path(tmp))


__all__ = [
    "CONFIG",
    "PREEMPTIBLE",
    "Host",
    "Pearld",
    "Trainer",
    "alive",
    "free_port",
    "lost_events",
    "overlap_serving",
    "poll",
    "status_vs_replay",
    "summary",
]
