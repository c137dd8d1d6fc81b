"""Virtual devices: a slot holds a fixed share of one core (``benchmarks/bench_device.py``
measures that two slots give twice one's throughput).

A step that names its work is charged its CPU time over the host's current inflation (CPU time
against the work's typical cost): the host's noise (cold caches after an idle, a step at the same
moment as the other slot's) is not billed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from pearl import config
from pearl.core.errors import ConfigError
from pearl.engines import device
from pearl.engines.device import VirtualDevice, check_fits, default_share

ROOT = Path(__file__).resolve().parents[2]
SHARE = 0.2


class FakeClock:
    """A CPU clock the test advances (the compute) and a wall clock that sleep advances."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0
        self.sleeps: list[float] = []

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.wall += s * 1.05  # the OS wakes us a little late

    def device(self, share: float, **kw: Any) -> VirtualDevice:
        return VirtualDevice(
            share, cpu_clock=lambda: self.cpu, clock=lambda: self.wall, sleep=self.sleep, **kw
        )

    def charged(self, d: VirtualDevice, work: object, cpu: float) -> float:
        """One step of ``work`` that takes ``cpu`` seconds; what the device charged for it."""
        before = d.charged_s
        with d.step(work):
            self.cpu += cpu
            self.wall += cpu
        return d.charged_s - before


def test_idle_is_in_proportion_to_compute() -> None:
    c = FakeClock()
    d = c.device(0.25)
    for _ in range(100):
        with d.step():
            c.cpu += 0.004
            c.wall += 0.004
    # 3 s of idle per 1 s of compute; a late wake-up is credited to the next step
    assert d.compute_s == pytest.approx(0.4)
    assert d.idle_s == pytest.approx(1.2, rel=0.02)
    assert d.utilization == pytest.approx(0.25, rel=0.02)
    assert d.wall_s == pytest.approx(1.6, rel=0.02)


def test_small_steps_carry_their_idle_and_an_idle_device_banks_nothing() -> None:
    c = FakeClock()
    d = c.device(0.5)  # 0.2 ms of compute owes 0.2 ms of idle: below MIN_SLEEP_S, carried
    for _ in range(20):
        with d.step():
            c.cpu += 0.0002
            c.wall += 0.0002
    assert 0.002 <= sum(c.sleeps) <= 0.004 + 1e-9
    assert all(0.001 - 1e-9 <= s < 0.0015 for s in c.sleeps)
    c.wall += 10.0  # no work for 10 s: the next step still idles for its own compute
    with d.step():
        c.cpu += 0.01
        c.wall += 0.01
    assert 0.009 <= c.sleeps[-1] <= 0.011


def test_compute_stretched_by_other_processes_is_made_up_within_the_credit() -> None:
    c = FakeClock()
    d = c.device(0.25)
    with d.step():  # 4 ms of CPU took 8 ms of wall time: the step still lasts 16 ms
        c.cpu += 0.004
        c.wall += 0.008
    assert c.sleeps == [pytest.approx(0.008)]
    credit = 0.008 * 0.05  # the late wake-up
    with d.step():  # 1 ms of CPU held up for 10 ms: 6 ms over its 4 ms, made up next
        c.cpu += 0.001
        c.wall += 0.010
    with d.step():
        c.cpu += 0.004
        c.wall += 0.004
    assert len(c.sleeps) == 2 and c.sleeps[-1] == pytest.approx(0.012 - 0.006 - credit)
    with d.step():  # stalled for 5 s: at most MAX_CREDIT_S is made up
        c.cpu += 0.001
        c.wall += 5.0
    for _ in range(40):
        with d.step():
            c.cpu += 0.004
            c.wall += 0.004
    assert sum(c.sleeps[2:]) == pytest.approx(40 * 0.012 - device.MAX_CREDIT_S, rel=0.05)


def test_keyed_steps_are_charged_their_cpu_time_over_the_hosts_inflation() -> None:
    c = FakeClock()
    d = c.device(0.5, typical_window=3, inflation_gain=0.5)

    def step(work: object, cpu: float) -> float:
        return c.charged(d, work, cpu)

    # no typical cost yet (fewer than 3 runs): charged what they took
    assert [step("decode-8", x) for x in (0.002, 0.004)] == pytest.approx([0.002, 0.004])
    assert step("decode-8", 0.003) == pytest.approx(0.003)  # the median: inflation stays 1
    # 6 ms against a median of 4 (of 4, 3, 6): 1.5x, inflation 1 -> 1.25
    assert step("decode-8", 0.006) == pytest.approx(0.006 / 1.25)
    assert d.inflation == pytest.approx(1.25)
    assert step("prefill-64", 0.009) == pytest.approx(0.009 / 1.25)  # the host's, for all work
    # a fast run (2 ms against a median of 3): the host's inflation falls below 1 as well
    assert step("decode-8", 0.002) == pytest.approx(0.002 / (1.25 + 0.5 * (2 / 3 - 1.25)))
    with d.step():  # a step that names no work: charged what it took
        c.cpu += 0.007
        c.wall += 0.007
    assert d.compute_s == pytest.approx(0.033)  # the CPU really spent is still counted
    assert d.wall_s >= d.charged_s / 0.5 * 0.99  # held at the share of what it was charged


def test_the_inflation_is_held_within_its_range() -> None:
    c = FakeClock()
    d = c.device(0.5, typical_window=3, inflation_gain=1.0)

    def step(cpu: float) -> float:
        return c.charged(d, "decode-8", cpu)

    for _ in range(3):
        step(0.004)
    step(0.0)  # 0 against a median of 4 ms: the floor, not 0 (the next charge would divide by it)
    assert d.inflation == device.INFLATION_RANGE[0]
    assert step(0.1) == pytest.approx(0.1 / device.INFLATION_RANGE[1])  # 25x the median: capped


def test_real_compute_is_held_at_the_share() -> None:
    d = VirtualDevice(0.2)
    t0 = time.monotonic()
    for _ in range(10):
        with d.step():
            end = time.thread_time() + 0.005
            while time.thread_time() < end:
                pass
    wall = time.monotonic() - t0
    assert d.compute_s >= 0.05
    assert wall >= d.compute_s / 0.2 * 0.98  # never faster than a fifth of a core
    assert 0.15 <= d.utilization <= 0.205  # slower only when other processes held the core


def test_a_share_outside_0_1_is_a_config_error_naming_it() -> None:
    for bad in ("0", "-0.2", "1.5"):
        with pytest.raises(ConfigError, match=rf"engine\.torch\.device_share = {bad}.*\(0, 1\]"):
            config.load(ROOT / "configs" / "local-cpu.toml", [f"engine.torch.device_share={bad}"])
    with pytest.raises(ConfigError, match=r"device_share = 0.*\(0, 1\]"):
        VirtualDevice(0.0)


def test_shares_that_oversubscribe_the_cores_are_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "available_cores", lambda: 2)
    with pytest.raises(
        ConfigError,
        match=r"6 slots x 0.4 core = 2.40 cores, more than the 2 "
        r"cores here.*at most 0.333",
    ):
        config.load(ROOT / "configs" / "local-cpu.toml", ["engine.torch.device_share=0.4"])
    cfg = config.load(ROOT / "configs" / "local-cpu.toml", ["engine.torch.device_share=0.3"])
    assert cfg.engine.torch.device_share == 0.3
    with pytest.raises(ConfigError, match="torch engine"):
        config.load(ROOT / "configs" / "sim-32.toml", ["engine.torch.device_share=0.01"])
    with pytest.raises(ConfigError, match="engine.torch.threads = 1"):
        config.load(
            ROOT / "configs" / "local-cpu.toml",
            ["engine.torch.device_share=0.2", "engine.torch.threads=2"],
        )
    check_fits(0.18, 10, 2)
    assert default_share(10, 2) == 0.18 and default_share(6, 2) == 0.3
    assert default_share(1, 8) == 1.0


def test_the_torch_engine_is_unthrottled_unless_asked() -> None:
    from pearl.engines.torch import TorchEngine

    assert TorchEngine(preset="tiny").virtual_device is None
    e = TorchEngine(preset="tiny", device_share=SHARE)
    assert e.virtual_device is not None and e.virtual_device.share == SHARE
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        TorchEngine(preset="tiny", device_share=1.2)
