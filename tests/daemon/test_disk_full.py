"""pearld on a disk that fills and frees again: it tells the truth, stays up, and heals alone.

The disk is a failpoint (``PEARL_DISK_FAULT``: full while a flag file exists), so the window
opens and closes at an exact moment, on any machine, with no tmpfs to mount.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pearl.core import events as ev
from pearl.log import failpoints
from tests.daemon.conftest import Pearld, wait_until
from transports.rpc import RemoteError

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("fault", "says"),
    [("full", "No space left on device"), ("eio", "Input/output error")],  # eio: cut fails too
)
def test_a_disk_fault_window_refuses_truthfully_and_heals_with_no_restart(
    pearld_factory: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fault: str, says: str
) -> None:
    flag = tmp_path / "disk-full"
    monkeypatch.setenv(failpoints.DISK_ENV, str(flag))
    d: Pearld = pearld_factory("daemon.borrow=always")
    s = d.settled()
    assert s["budget"]["lent"]  # training GPUs lent after a step, as in the report
    d.event(ev.TrainingBegin(step=1))
    wait_until(lambda: d.status()["training_may_proceed"] == 1, 20, "training may proceed")
    d.event(ev.TrainingFinished(step=1, weights_version=1))
    before = d.settled()["seq"]

    flag.write_text(fault)
    for _attempt in range(3):  # the trainer retries; each refusal says why and changes nothing
        with pytest.raises(RemoteError, match=says):
            d.event(ev.TrainingBegin(step=2))
    with pytest.raises(RemoteError, match=says):
        d.event(ev.GpusAdded(gpus=(8, 9)))
    s = d.status()
    assert (s["seq"], s["phase"], s["training_step"]) == (before, "idle", 1)
    assert d.proc is not None and d.proc.poll() is None

    flag.unlink()  # the disk heals: the same pearld takes events again
    seq = wait_until(lambda: _try(d, ev.TrainingBegin(step=2)), 20, "training-begin to be accepted")
    assert seq > before
    wait_until(lambda: d.status()["training_may_proceed"] == 2, 20, "training may proceed")
    d.event(ev.TrainingFinished(step=2, weights_version=2))
    d.settled()
    assert d.proc.poll() is None and d.starts == 1
    assert d.stop() == 0
    begins = [r.step for _, r in d.records() if isinstance(r, ev.TrainingBegin)]
    assert begins == [1, 2]  # each once: no refused attempt was ever logged
    assert d.replayed().training_step == 2


def _try(d: Pearld, record: Any) -> int | None:
    try:
        return d.event(record)
    except RemoteError as e:
        assert "rejected: LogWriteFailed" in str(e), e
        return None
