"""Child process for the crash tests: append a fixed record stream, snapshot now and then.

``python -m tests.log.crash_child DIR BATCHES`` prints ``ack SEQ`` (flushed) each time an append
returns, and ``snap SEQ`` after each snapshot; ``PEARL_FAILPOINT`` decides where it dies.
"""

from __future__ import annotations

import sys

from pearl.core.fold import apply_to
from pearl.core.state import ClusterState
from pearl.log import FileLog
from pearl.testing.workload import Workload

SEED = 3
SNAPSHOT_EVERY = 4


def batches(n: int) -> list[list[object]]:
    """The first ``n`` record batches the child appends (the parent recomputes them)."""
    out = []
    for batch in Workload(SEED).batches():
        out.append(batch)
        if len(out) == n:
            return out
    raise AssertionError("unreachable")


def main(path: str, n: int) -> None:
    builder = ClusterState().thaw()
    with FileLog(path) as log:
        for i, batch in enumerate(batches(n), start=1):
            seqs = log.append(batch)
            print(f"ack {seqs[-1]}", flush=True)
            for seq, record in zip(seqs, batch, strict=True):
                apply_to(builder, record, seq)
            if i % SNAPSHOT_EVERY == 0:
                log.write_snapshot(builder.freeze(), {"batches": i})
                print(f"snap {builder.seq}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
