"""Minimal-change plan generation (paper §4.4.2, eq. 5-6).

Membership is fixed by the budget: workers on reclaimed GPUs leave, free dedicated GPU groups get
new workers in the lowest empty slots, and overlap workers join while training GPUs are borrowed
and leave when they are not. Among survivors ``S = W ∩ W'`` each role keeps up to its target count
(lowest slot ids first); the remaining deficits are filled by joiners, then by the survivors in
excess. That reaches the minimum change count ``D_worker + D_role`` and never moves a survivor's
slot or GPU binding.

Steps come in stages that executors run in order (all steps of a stage finish before the next
stage starts): returns first (they are mandatory), then the training hand-off, then joiners
(initialised in the background while everyone else serves), then role switches and atomic
admission at commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pearl.core.errors import InfeasibleConfiguration
from pearl.core.state import (
    ROLLOUT_ROLES,
    Activity,
    ClusterState,
    Role,
    Step,
    StepOp,
    Target,
    TrainingPhase,
    Worker,
    Zone,
)

STAGE = {
    StepOp.REMOVE: 0,
    StepOp.DEACTIVATE: 0,
    StepOp.RECLAIM: 1,
    StepOp.LEND: 1,
    StepOp.ADD: 2,
    StepOp.ACTIVATE: 2,
    StepOp.SET_ROLE: 3,
}
JOIN_OPS = (StepOp.ADD, StepOp.ACTIVATE)


@dataclass(frozen=True, slots=True)
class Membership:
    """W' split by how each member gets there."""

    survivors: tuple[Worker, ...]  # in W and W': keep slot and binding
    reactivate: tuple[Worker, ...]  # retained overlap workers that join again
    new_groups: tuple[tuple[tuple[int, ...], Zone], ...]  # free GPU groups for new workers
    leave: tuple[Worker, ...]  # in W, not in W'
    lend: int | None = None  # training worker to release its GPUs first
    reclaim: int | None = None  # training worker to take its GPUs back

    @property
    def N(self) -> int:
        """Rollout workers in W' (the decision's budget N_k)."""
        return len(self.survivors) + len(self.reactivate) + len(self.new_groups)

    @property
    def N_dedicated(self) -> int:
        return sum(1 for w in self.survivors if w.zone is Zone.DEDICATED) + sum(
            1 for _, z in self.new_groups if z is Zone.DEDICATED
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """(W_add, W_remove, rho) and the ordered steps that realise it."""

    target: Target
    W_add: tuple[int, ...]
    W_remove: tuple[int, ...]
    rho: tuple[tuple[int, Role], ...]  # survivors that switch role, and to what
    steps: tuple[Step, ...]

    @property
    def D_worker(self) -> int:
        """Eq. 5: membership changes."""
        return len(self.W_add) + len(self.W_remove)

    @property
    def D_role(self) -> int:
        """Eq. 6: role changes among survivors."""
        return len(self.rho)

    @property
    def empty(self) -> bool:
        return not self.steps


def _groups(gpus: Iterable[int], tp: int) -> list[tuple[int, ...]]:
    s = sorted(gpus)
    return [tuple(s[i : i + tp]) for i in range(0, len(s) - tp + 1, tp)]


def membership(
    state: ClusterState,
    borrow: bool,
    exclude_gpus: frozenset[int] = frozenset(),
    evict: frozenset[int] = frozenset(),
) -> Membership:
    """Who is in W' given the GPUs present now and whether training GPUs are borrowed.

    ``exclude_gpus`` keeps GPUs out of new groups (e.g. ones whose worker keeps failing);
    ``evict`` names members that must leave (e.g. workers their supervisor gave up on).
    """
    if borrow and state.phase is TrainingPhase.TRAINING:
        raise InfeasibleConfiguration(
            "cannot borrow training GPUs while a training step needs them"
        )
    survivors, leave = [], []
    reclaiming = state.reclaiming_gpus
    # Under a preemption notice: in neither W' nor the leavers. They finish their turns and go
    # at the deadline; W' is planned for the budget after it, at once.
    noticed = state.leaving_gpus
    bound: set[int] = set()
    training, inactive, dedicated = Role.TRAINING, Activity.INACTIVE, Zone.DEDICATED
    for wid in sorted(state.workers):  # slot order; plain loop: this runs at 16k workers
        w = state.workers[wid]
        if w.role is training:
            continue
        bound.update(w.gpus)
        if w.activity is inactive:
            continue
        gone = reclaiming and w.zone is dedicated and not reclaiming.isdisjoint(w.gpus)
        if noticed and not gone and any(g in noticed for g in w.gpus):
            if wid in evict:
                leave.append(w)
            continue
        if gone or wid in evict or (w.zone is not dedicated and not borrow):
            leave.append(w)
        else:
            survivors.append(w)
    free = state.dedicated_gpus - bound - exclude_gpus - noticed.keys()
    new_groups = [(g, Zone.DEDICATED) for g in _groups(free, state.tp)]
    reactivate: list[Worker] = []
    trainers = state.training_workers()
    lend = reclaim = None
    if borrow:
        retained = {
            w.gpus: w
            for w in state.rollout_workers(Zone.OVERLAP)
            if w.activity is Activity.INACTIVE
        }
        for g in _groups(state.training_gpus, state.tp):
            if g in retained:
                if not set(g) & exclude_gpus:  # a worker whose activation failed waits it out
                    reactivate.append(retained[g])
            elif not any(x in bound for x in g) and not set(g) & exclude_gpus:
                new_groups.append((g, Zone.OVERLAP))
        if (
            trainers
            and trainers[0].activity is Activity.ACTIVE
            and (reactivate or any(z is Zone.OVERLAP for _, z in new_groups))
        ):
            lend = trainers[0].id
    elif (
        trainers
        and state.phase is TrainingPhase.TRAINING
        and trainers[0].activity is not Activity.ACTIVE
    ):
        reclaim = trainers[0].id
    return Membership(
        survivors=tuple(survivors),
        reactivate=tuple(reactivate),
        new_groups=tuple(new_groups),
        leave=tuple(leave),
        lend=lend,
        reclaim=reclaim,
    )


def _free_slots(state: ClusterState, n: int) -> list[int]:
    """The n lowest empty slots (new workers reuse them; survivors keep theirs)."""
    if not n:
        return []
    return sorted(set(range(len(state.workers) + n)) - state.workers.keys())[:n]


def plan(state: ClusterState, target: Target, m: Membership) -> Plan:
    """Turn target counts into the minimal-change plan from ``state`` (eq. 5-6)."""
    if target.N != m.N:
        raise InfeasibleConfiguration(f"target {target} has {target.N} workers but W' has {m.N}")
    dst = {r: target.count(r) for r in ROLLOUT_ROLES}
    kept = dict.fromkeys(ROLLOUT_ROLES, 0)
    held = dict.fromkeys(ROLLOUT_ROLES, 0)  # roles kept in the dedicated zone
    excess: list[Worker] = []
    dedicated = Zone.DEDICATED
    for w in m.survivors:  # already sorted by slot id
        role = w.role
        if kept[role] < dst[role]:
            kept[role] += 1
            if w.zone is dedicated:
                held[role] += 1
        else:
            excess.append(w)
    deficit = {r: dst[r] - kept[r] for r in ROLLOUT_ROLES}
    # Roles on dedicated GPUs should form a usable configuration on their own: borrowed overlap
    # workers leave at every Training Begin. Joiners' roles are free and every survivor in excess
    # switches anyway, so filling deficits in the dedicated zone first, balanced, costs no extra
    # change (eq. 5-6) and spares a forced re-role (with rollout paused) after each return.

    def take(zone: Zone, preferred: Role | None = None) -> Role:
        open_roles = [r for r in ROLLOUT_ROLES if deficit[r] > 0]
        if preferred is not None and deficit.get(preferred, 0) > 0:
            role = preferred
        elif zone is Zone.DEDICATED:
            role = min(open_roles, key=lambda r: (held[r], -deficit[r]))
        else:
            role = max(open_roles, key=lambda r: deficit[r])
        deficit[role] -= 1
        if zone is Zone.DEDICATED:
            held[role] += 1
        return role

    slots = _free_slots(state, len(m.new_groups))
    new_roles: dict[int, Role] = {}
    rho: list[tuple[int, Role]] = []
    for w in excess:
        if w.zone is Zone.DEDICATED:
            rho.append((w.id, take(Zone.DEDICATED)))
    for k, (_, zone) in enumerate(m.new_groups):
        if zone is Zone.DEDICATED:
            new_roles[k] = take(zone)
    act_roles = [take(w.zone, w.role) for w in m.reactivate]  # a retained worker keeps its role
    for k, (_, zone) in enumerate(m.new_groups):
        if zone is not Zone.DEDICATED:
            new_roles[k] = take(zone)
    for w in excess:
        if w.zone is not Zone.DEDICATED:
            rho.append((w.id, take(w.zone)))
    assert not any(deficit.values()), "every target role is filled"

    steps: list[Step] = [
        Step(op=StepOp.REMOVE if w.zone is Zone.DEDICATED else StepOp.DEACTIVATE, worker=w.id)
        for w in m.leave
    ]
    if m.reclaim is not None:
        steps.append(Step(op=StepOp.RECLAIM, worker=m.reclaim))
    if m.lend is not None:
        steps.append(Step(op=StepOp.LEND, worker=m.lend))
    W_add: list[int] = []
    for w, role in zip(m.reactivate, act_roles, strict=True):
        steps.append(Step(op=StepOp.ACTIVATE, worker=w.id, role=role, gpus=w.gpus, zone=w.zone))
        W_add.append(w.id)
    for k, (slot, (gpus, zone)) in enumerate(zip(slots, m.new_groups, strict=True)):
        steps.append(Step(op=StepOp.ADD, worker=slot, role=new_roles[k], gpus=gpus, zone=zone))
        W_add.append(slot)
    steps += [Step(op=StepOp.SET_ROLE, worker=wid, role=role) for wid, role in rho]
    return Plan(
        target=target,
        W_add=tuple(W_add),
        W_remove=tuple(w.id for w in m.leave),
        rho=tuple(rho),
        steps=tuple(steps),
    )


def ready_steps(steps: tuple[Step, ...], done: Iterable[int]) -> list[int]:
    """Steps of a plan that may run now: the lowest unfinished stage, and the training hand-off
    as soon as no overlap worker still holds the training GPUs — a return never waits for a
    preemptible worker on other GPUs to leave (§4.6: borrowed GPUs come back in bounded time)."""
    finished = set(done)
    todo = [k for k in range(len(steps)) if k not in finished]
    if not todo:
        return []
    stage = min(STAGE[steps[k].op] for k in todo)
    out = [k for k in todo if STAGE[steps[k].op] == stage]
    if stage == STAGE[StepOp.REMOVE] and not any(steps[k].op is StepOp.DEACTIVATE for k in todo):
        out += [k for k in todo if steps[k].op in (StepOp.LEND, StepOp.RECLAIM)]
    return out


def min_changes(state: ClusterState, target: Target, m: Membership) -> tuple[int, int]:
    """Eq. 5-6 computed directly from the role counts: (D_worker, D_role)."""
    n_src = dict.fromkeys(ROLLOUT_ROLES, 0)
    for w in m.survivors:
        n_src[w.role] += 1
    D_worker = len(m.reactivate) + len(m.new_groups) + len(m.leave)
    D_role = sum(n_src[r] - min(n_src[r], target.count(r)) for r in ROLLOUT_ROLES)
    return D_worker, D_role


__all__ = [
    "JOIN_OPS",
    "STAGE",
    "Membership",
    "Plan",
    "membership",
    "min_changes",
    "plan",
    "ready_steps",
]
