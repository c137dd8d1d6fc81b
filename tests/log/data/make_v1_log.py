"""How tests/log/data/v1-log was made: with the v1 codec (the hand-written pearl.core.schema),
before the move to msgspec. Kept for the record; do not regenerate the fixture with a newer PEARL
(its point is that the old code wrote it). Run from the repository root.
"""

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, ".")

from pearl.core import events as ev  # noqa: E402
from pearl.core.schema import to_wire  # noqa: E402
from pearl.core.state import Mode, Target  # noqa: E402
from pearl.log import FileLog  # noqa: E402
from pearl.log.snapshot import state_to_snapshot  # noqa: E402
from pearl.testing.workload import Workload  # noqa: E402

out = Path("tests/log/data/v1-log")
if out.exists():
    shutil.rmtree(out)
batches = []
n = 0
wl = Workload(seed=3)
for b in wl.batches():
    batches.append(b)
    n += len(b)
    if n >= 400 and wl.b.plan is None:
        break
with FileLog(out) as log:
    done = 0
    for b in batches:
        log.append(b)
        done += len(b)
        if done >= 250 and not log.snapshots():
            log.write_snapshot(log.load().state, {"note": "written by the v1 codec", "step": 3})
    st = log.load().state
    # kinds the workload does not emit
    p = st.last_plan + 1
    log.append(
        [
            ev.WeightsPublished(version=st.weights_version + 1, uri="file:///w/v"),
            ev.WeightsPublished(version=st.weights_version + 2),
            ev.PlanBegin(
                plan=p,
                cause="test",
                target=Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=2, N_C=0),
                steps=(),
                mandatory=True,
            ),
            ev.PlanAbort(plan=p, reason="cancelled"),
        ]
    )
    st = log.load().state
    recs = [to_wire(r) for _, r in log.read()]
print(st.seq, Counter(r["kind"] for r in recs))
(out / "LOCK").unlink()
exp = {"last_seq": st.seq, "snapshot_seq": 251, "state": state_to_snapshot(st), "records": recs}
Path("tests/log/data/v1-log.expected.json").write_text(json.dumps(exp, sort_keys=True) + "\n")
