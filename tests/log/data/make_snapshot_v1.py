"""How tests/log/data/snapshot-v1.bin was made: with the snapshot codec of format 1 as it stood
before the table's snapshot moved to msgspec types (a hand-written converter per field). Kept for
the record; do not regenerate the fixture with a newer PEARL (its point is that the old code wrote
it). Run from the repository root:
``PYTHONPATH=. .venv/bin/python tests/log/data/make_snapshot_v1.py``.

The table: tp 2; training GPUs 0-7 lent to rollout (a borrow in progress: the training worker
inactive, two overlap workers active, one kept inactive); reserved GPUs 8-11; preemptible GPUs
12-19, of which 12-17 were granted, 16-17 reclaimed while bound to a worker and 16 granted again,
14-15 under a reclaim notice; prefill, decode and colocated workers; a plan in flight with one
step of three done.
"""

from pathlib import Path

from pearl.core import events as ev
from pearl.core.fold import replay
from pearl.core.state import Activity, Mode, Role, Step, StepOp, Target, Zone
from pearl.log import snapshot

A, I, D, O = Activity.ACTIVE, Activity.INACTIVE, Zone.DEDICATED, Zone.OVERLAP
RECORDS = [
    ev.ClusterInit(
        tp=2,
        training_gpus=tuple(range(8)),
        reserved_gpus=(8, 9, 10, 11),
        preemptible_gpus=tuple(range(12, 20)),
    ),
    ev.GpusAdded(gpus=(12, 13, 14, 15, 16, 17)),
    ev.WorkerAdded(worker=1, gpus=(8, 9), role=Role.PREFILL, zone=D),
    ev.ActivityChanged(worker=1, activity=A),
    ev.WorkerAdded(worker=2, gpus=(10, 11), role=Role.DECODE, zone=D),
    ev.ActivityChanged(worker=2, activity=A),
    ev.WorkerAdded(worker=3, gpus=(12, 13), role=Role.DECODE, zone=D),
    ev.ActivityChanged(worker=3, activity=A),
    ev.WorkerAdded(worker=4, gpus=(16, 17), role=Role.COLOCATED, zone=D),
    ev.ActivityChanged(worker=4, activity=A),
    ev.WorkerAdded(worker=8, gpus=(14, 15), role=Role.PREFILL, zone=D),
    ev.ActivityChanged(worker=8, activity=A),
    ev.TrainingBegin(step=1),
    ev.TrainingFinished(step=1, weights_version=1),
    ev.PlanBegin(
        plan=1,
        cause="expand",
        target=Target(mode=Mode.DISAGGREGATED, N_P=2, N_D=4, N_C=0),
        steps=(
            Step(op=StepOp.LEND, worker=0),
            Step(op=StepOp.ADD, worker=5, role=Role.DECODE, gpus=(0, 1), zone=O),
            Step(op=StepOp.ADD, worker=6, role=Role.DECODE, gpus=(2, 3), zone=O),
        ),
    ),
    ev.ActivityChanged(worker=0, activity=I),
    ev.StepDone(plan=1, step=0),
    ev.WorkerAdded(worker=5, gpus=(0, 1), role=Role.DECODE, zone=O),
    ev.ActivityChanged(worker=5, activity=A),
    ev.StepDone(plan=1, step=1),
    ev.WorkerAdded(worker=6, gpus=(2, 3), role=Role.DECODE, zone=O),
    ev.ActivityChanged(worker=6, activity=A),
    ev.StepDone(plan=1, step=2),
    ev.PlanCommit(plan=1),
    ev.WorkerAdded(worker=7, gpus=(4, 5), role=Role.COLOCATED, zone=O),
    ev.ActivityChanged(worker=7, activity=I),
    ev.WeightsPublished(version=2, uri="file:///w/2"),
    ev.GpusReclaimed(gpus=(16, 17)),
    ev.GpusAdded(gpus=(16,)),
    ev.GpusReclaiming(gpus=(14, 15), deadline=1_800_000_000.25),
    ev.PlanBegin(
        plan=2,
        cause="rebalance",
        target=Target(mode=Mode.DISAGGREGATED, N_P=1, N_D=5, N_C=0),
        steps=(
            Step(op=StepOp.SET_ROLE, worker=8, role=Role.DECODE),
            Step(op=StepOp.REMOVE, worker=4),
            Step(op=StepOp.ACTIVATE, worker=7),
        ),
    ),
    ev.RoleChanged(worker=8, role=Role.DECODE),
    ev.StepDone(plan=2, step=0),
]

if __name__ == "__main__":
    state = replay(RECORDS)
    data = snapshot.encode(state, {"note": "written by the format-1 field converters"})
    Path("tests/log/data/snapshot-v1.bin").write_bytes(data)
    print(state.seq, len(data), "bytes")
    print(state)
