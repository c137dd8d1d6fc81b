"""Facade servers shared by the sglang tests: real torch-engine compute behind SGLang's HTTP API.

Four servers start once per session, in parallel: a new-style (0.5.21) colocated one, a new-style
prefill/decode pair launched with --enable-pd-role-switch, and an old-style (0.4.10) colocated one.
Every process is stopped by its pid at the end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from pearl.core.state import Role
from pearl.engines.sglang import FACADE_MODULE, ServerSpec, SGLangEngine, SGLangEngineConfig
from tests import ports
from transports.bulk import ZmqKVChannel

NEW, OLD = "0.5.21", "0.4.10"
BOOT_OFFSET = 100  # a worker's bootstrap port = its port + BOOT_OFFSET


def free_base(n: int) -> int:
    """A port p with p .. p+n and its bootstrap ports p+BOOT_OFFSET .. free (tests/ports.py)."""
    return ports.free_base(n, BOOT_OFFSET)


@dataclass
class Servers:
    base: int
    coloc: SGLangEngine  # 0.5.21, colocated
    prefill: SGLangEngine  # 0.5.21, PD, role switch on
    decode: SGLangEngine
    old: SGLangEngine  # 0.4.10, colocated, with a KV channel (restart-based role changes)
    channels: list[ZmqKVChannel]

    def all(self) -> list[SGLangEngine]:
        return [self.coloc, self.prefill, self.decode, self.old]


def spec(base: int, i: int, version: str, **kw: object) -> ServerSpec:
    return ServerSpec(
        model_path="tiny",
        port=base + i,
        bootstrap_port=base + BOOT_OFFSET + i,
        module=FACADE_MODULE,
        extra_args=("--pretend-version", version, "--kv-timeout-s", "10"),
        **kw,
    )  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    base = free_base(4)
    chans = [ZmqKVChannel() for _ in range(3)]

    def engine(
        i: int, version: str, role: Role, ch: ZmqKVChannel | None, **kw: object
    ) -> SGLangEngine:
        return SGLangEngine(
            SGLangEngineConfig(
                spec(base, i, version, **kw),
                startup_timeout_s=90,
                kv_timeout_s=10,
                idle_timeout_s=20,
            ),
            role=role,
            kv_channel=ch,
        )

    s = Servers(
        base=base,
        coloc=engine(0, NEW, Role.COLOCATED, None),
        prefill=engine(1, NEW, Role.PREFILL, chans[0], role_switch=True),
        decode=engine(2, NEW, Role.DECODE, chans[1], role_switch=True),
        old=engine(3, OLD, Role.COLOCATED, chans[2]),
        channels=chans,
    )
    errors: list[BaseException] = []

    def start(e: SGLangEngine) -> None:
        try:
            e.start()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=start, args=(e,)) for e in s.all()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            raise errors[0]
        yield s
    finally:
        for e in s.all():
            e.stop()
        for ch in chans:
            ch.close()
