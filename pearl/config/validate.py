"""The rules that span keys or sections of a :class:`~pearl.config.Config`: GPU pools that do
not overlap, Ray nodes that hold the table's GPUs, a gateway that is not open to the network
without a key, an engine that can serve the PD mode, virtual devices that fit the cores."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING

from pearl.config.engine import EngineKind, RouterKind
from pearl.config.gpus import available_cores
from pearl.config.ranges import check_ranges
from pearl.config.rl import parse_budget
from pearl.core.address import check_exposure, is_local, parse_address
from pearl.core.bounds import check_fits, check_share
from pearl.core.errors import ConfigError, InsecureBind
from pearl.core.policy import PD

if TYPE_CHECKING:
    from pearl.config.schema import Config


MAX_GATEWAY_PROCESSES = 64


def check(cfg: Config) -> None:
    """Raise ConfigError (or InsecureBind) for the first rule ``cfg`` breaks."""
    for sf in dataclasses.fields(cfg):
        check_ranges(getattr(cfg, sf.name), sf.name)
    _check_pools(cfg)
    d = cfg.decision
    if not 0.0 < d.prefill_max_utilization <= 1.0:
        raise ConfigError(
            f"decision.prefill_max_utilization must be in (0, 1], got {d.prefill_max_utilization}"
        )
    if not 0.0 < d.ema_alpha <= 1.0:
        raise ConfigError(f"decision.ema_alpha must be in (0, 1], got {d.ema_alpha}")
    if d.mode_switch_threshold < 0 or d.ratio_change_threshold < 0:
        raise ConfigError("decision thresholds must be >= 0")
    if cfg.daemon.metrics:
        parse_address(cfg.daemon.metrics)
        check_exposure(cfg.daemon.metrics, cfg.daemon.metrics_public)
    _check_nodes(cfg)
    _check_gateway(cfg)
    if cfg.engine.colocated_only and cfg.daemon.pd is PD.DISAGGREGATED:
        raise ConfigError(
            "engine.kind = 'vllm' serves colocated only (no prefill-decode hand-off through "
            "a vLLM KV connector on this platform, docs/vllm.md); set daemon.pd = "
            "'colocated' or 'adaptive'"
        )
    if cfg.engine.torch.device_share is not None:
        _check_devices(cfg)
    parse_budget(cfg.demo.budget, len(cfg.cluster.preemptible_gpus))


def _check_pools(cfg: Config) -> None:
    """The three GPU pools share no id; the preemptible GPUs present at start are preemptible."""
    c = cfg.cluster
    pools = {
        "training_gpus": c.training_gpus,
        "reserved_gpus": c.reserved_gpus,
        "preemptible_gpus": c.preemptible_gpus,
    }
    names = list(pools)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = set(pools[a]) & set(pools[b])
            if both:
                raise ConfigError(f"cluster.{a} and cluster.{b} share GPU ids {sorted(both)}")
    extra = set(c.initial_preemptible) - set(c.preemptible_gpus)
    if extra:
        raise ConfigError(f"cluster.initial_preemptible {sorted(extra)} are not preemptible GPUs")
    if not 0.0 < c.mem_fraction <= 1.0:
        raise ConfigError(f"cluster.mem_fraction must be in (0, 1], got {c.mem_fraction}")


def _check_gateway(cfg: Config) -> None:
    g = cfg.gateway
    for origin in g.allowed_origins:
        if not re.fullmatch(r"https?://[^/\s?#@]+", origin.strip().rstrip("/")):
            raise ConfigError(
                f"gateway.allowed_origins: {origin!r} is not an origin; expected "
                'scheme://host[:port], e.g. "http://localhost:3000"'
            )
    if g.processes > MAX_GATEWAY_PROCESSES:
        raise ConfigError(
            f"gateway.processes = {g.processes}: at most {MAX_GATEWAY_PROCESSES} (each one is a "
            "Python process with a Router of its own)"
        )
    if g.processes and not g.listen:
        raise ConfigError(
            f"gateway.processes = {g.processes} needs gateway.listen: the processes serve it"
        )
    if g.processes and cfg.engine.router is RouterKind.SGLANG_ROUTER:
        raise ConfigError(
            "gateway.processes route to the worker hosts themselves; with engine.router = "
            '"sglang-router" the gateway runs inside pearld: set gateway.processes = 0'
        )
    if not g.listen:
        return
    parse_address(g.listen, "gateway.listen")
    if not g.api_key_file and not is_local(f"tcp://{g.listen}"):
        raise InsecureBind(
            f"refusing to serve gateway.listen on {g.listen} without an API key: it may be "
            "reachable from other machines. Set gateway.api_key_file to a file holding the "
            "key clients must send, or bind 127.0.0.1:PORT"
        )


def _check_nodes(cfg: Config) -> None:
    """Each [[cluster.nodes]] entry names one node and holds GPUs of the table, no two the
    same GPU."""
    c = cfg.cluster
    universe = set(c.training_gpus) | set(c.reserved_gpus) | set(c.preemptible_gpus)
    seen: dict[int, int] = {}
    for i, n in enumerate(c.nodes):
        where = f"cluster.nodes[{i}]"
        if sum(bool(x) for x in (n.address, n.node_id, n.label)) != 1:
            raise ConfigError(f"{where}: give exactly one of address, node_id or label")
        if n.label and "=" not in n.label:
            raise ConfigError(f"{where}.label = {n.label!r}: expected KEY=VALUE")
        if not n.gpus:
            raise ConfigError(f"{where}.gpus: a node holds at least one GPU of the table")
        if set(n.gpus) - universe:
            raise ConfigError(
                f"{where}.gpus {sorted(set(n.gpus) - universe)} are not GPUs of the cluster "
                "(training_gpus, reserved_gpus or preemptible_gpus)"
            )
        for g in n.gpus:
            if g in seen:
                raise ConfigError(f"{where}: GPU {g} is held by cluster.nodes[{seen[g]}] too")
            seen[g] = i


def _check_devices(cfg: Config) -> None:
    """Virtual devices: a share in (0, 1], on the torch engine, all slots within the cores."""
    e, t, c = cfg.engine, cfg.engine.torch, cfg.cluster
    share = check_share(t.device_share, "engine.torch.device_share")  # type: ignore[arg-type]
    if e.kind is not EngineKind.TORCH:
        raise ConfigError(
            f"engine.torch.device_share = {share:g} models a device on the torch engine; "
            f"engine.kind = {e.kind.value!r} does not run on this machine's cores. Remove it"
        )
    if t.threads != 1:
        raise ConfigError(
            f"engine.torch.device_share = {share:g} holds one torch thread per slot; "
            f"engine.torch.threads = {t.threads}. Set engine.torch.threads = 1"
        )
    if c.tp * share > 1.0:
        raise ConfigError(
            f"engine.torch.device_share = {share:g} with cluster.tp = {c.tp}: a worker of "
            f"{c.tp} slots needs {c.tp * share:.2f} of its one thread's core; use at most "
            f"{1 / c.tp:.3f}"
        )
    slots = len(c.training_gpus) + len(c.reserved_gpus) + len(c.preemptible_gpus)
    check_fits(share=share, slots=slots, cores=available_cores(), where="engine.torch.device_share")


__all__ = ["check"]
