"""One typed configuration schema, loaded from TOML, with ``--set section.key=value`` overrides.

Each section is a frozen dataclass; unknown sections or keys are errors that suggest the closest
valid name. GPU lists accept arrays of ids or range strings such as ``"0-15"`` or ``"16-19,24"``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import math
import os
import re
import stat
import tomllib
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pearl.core.address import check_exposure, is_local, parse_address
from pearl.core.bounds import MAX_GPU_ID, MAX_GPUS, check_fits, check_share, gpu_ids_problem
from pearl.core.errors import ConfigError, InsecureBind
from pearl.core.policy import PD, Borrow

GpuList = tuple[int, ...]

# One item of a GPU list string: an id or a range, ASCII digits only (Python's int() also takes
# "٣" and "1_000").
_GPU_ITEM = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?", re.ASCII)


class EngineKind(enum.StrEnum):
    """``engine.kind``: what serves the rollouts."""

    SIM = "sim"  # simulated workers (pearl.engines.sim)
    TORCH = "torch"  # PEARL's own torch engine (pearl.engines.torch)
    SGLANG = "sglang"  # one SGLang server per worker host
    VLLM = "vllm"  # one vLLM server per worker host; colocated only


class Launcher(enum.StrEnum):
    """``daemon.launcher``: where worker hosts run."""

    LOCAL = "local"  # processes on this machine
    RAY = "ray"  # Ray actors on the GPUs' nodes


class RouterKind(enum.StrEnum):
    """``engine.router``: what routes requests to the workers."""

    PEARL = "pearl"  # PEARL's own Router
    SGLANG_ROUTER = "sglang-router"  # the real sglang-router


class RoleSwitch(enum.StrEnum):
    """``engine.sglang_role_switch``: pass ``--enable-pd-role-switch`` to SGLang servers."""

    AUTO = "auto"  # when the installed SGLang has it (0.5.21+)
    ON = "on"
    OFF = "off"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def parse_gpus(value: Any, where: str = "gpus") -> GpuList:
    """``[0, 1, 2]``, ``"0-3"``, ``"0-3,8"`` or ``""`` -> a sorted tuple of distinct ids.

    Ids are 0..MAX_GPU_ID, at most MAX_GPUS of them (:mod:`pearl.core.bounds`); a range is checked
    before it is expanded, so a typo such as ``24-2000000000`` is one line, not the machine's
    memory."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, str):
        spans: list[tuple[int, int]] = []
        count = 0
        parts = [p.strip() for p in value.split(",")]
        if parts == [""]:
            parts = []  # "" and "  ": no GPU
        for part in parts:
            shown = part if len(part) <= 40 else part[:37] + "..."
            if not part:
                raise ConfigError(
                    f"{where}: {value!r} has an empty item between commas; "
                    "write ids and ranges like 0-3,8"
                )
            m = _GPU_ITEM.fullmatch(part)
            try:
                if m is None:
                    raise ValueError(part)
                a = int(m[1])
                b = int(m[2]) if m[2] is not None else a
            except ValueError:  # not one, or more digits than int() converts
                raise ConfigError(
                    f"{where}: {shown!r} is not a GPU id or range like 0-15 "
                    "(ASCII digits 0-9, no signs or underscores)"
                ) from None
            if b < a:
                raise ConfigError(f"{where}: range {shown!r} runs backwards")
            if b > MAX_GPU_ID:
                raise ConfigError(f"{where}: {shown!r} is out of range: GPU ids are 0-{MAX_GPU_ID}")
            count += b - a + 1
            if count > MAX_GPUS:
                raise ConfigError(
                    f"{where}: more than {MAX_GPUS} GPU ids (at {shown!r}); at most {MAX_GPUS} "
                    "in one list"
                )
            spans.append((a, b))
        value = [g for a, b in spans for g in range(a, b + 1)]
    if not isinstance(value, list | tuple) or not all(
        isinstance(g, int) and not isinstance(g, bool) for g in value
    ):
        raise ConfigError(f"{where}: expected GPU ids (a list of ints >= 0 or a range string)")
    why = gpu_ids_problem(value)
    if why is not None:
        raise ConfigError(f"{where}: {why}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{where}: a GPU id appears twice")
    return tuple(sorted(value))


def format_gpus(gpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_gpus`: ``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``; ``"-"`` for none."""
    ids = sorted(gpus)
    if not ids:
        return "-"
    parts, lo, prev = [], ids[0], ids[0]
    for g in [*ids[1:], None]:
        if g is not None and g == prev + 1:
            prev = g
            continue
        parts.append(str(lo) if lo == prev else f"{lo}-{prev}")
        if g is not None:
            lo = prev = g
    return ",".join(parts)


@dataclass(frozen=True)
class NodeConfig:
    """``[[cluster.nodes]]``: one Ray node and the table's GPUs it holds (launcher = "ray").
    Exactly one of ``address``, ``node_id`` or ``label`` names it."""

    gpus: GpuList = ()
    """The table's GPUs this node holds."""
    address: str = ""
    """The node's IP as Ray reports it."""
    node_id: str = ""
    """Ray's hex id of the node."""
    label: str = ""
    """``KEY=VALUE``: a label the node was started with (``ray start --labels``)."""

    def names(self) -> str:
        return self.address or self.node_id or self.label


@dataclass(frozen=True)
class ClusterConfig:
    """``[cluster]``: the GPUs PEARL manages and how they are grouped into workers."""

    gpu: str = "H800"
    """GPU model, a name in the catalog (sets the roofline and memory)."""
    tp: int = 2
    """GPUs per worker (tensor parallelism)."""
    training_gpus: GpuList = tuple(range(0, 16))
    """GPUs the trainer holds; lent to rollouts between training steps."""
    reserved_gpus: GpuList = tuple(range(16, 20))
    """GPUs that serve rollouts all the time."""
    preemptible_gpus: GpuList = tuple(range(20, 32))
    """GPUs that may come and go (spot instances)."""
    initial_preemptible: GpuList = ()
    """Preemptible GPUs present at start."""
    mem_fraction: float = 0.9
    """Share of a worker's HBM for weights and KV cache (sets H_max)."""
    nodes: tuple[NodeConfig, ...] = ()
    """Ray nodes and their GPUs; none: each node names its own (the ``ray.gpus_label`` label)."""


@dataclass(frozen=True)
class ModelConfig:
    """``[model]``: the model being trained and served."""

    name: str = "qwen3-8b"
    """Model name in the catalog (sets the cost model's priors)."""


@dataclass(frozen=True)
class WorkloadConfig:
    """``[workload]``: the rollout workload, and priors for its profile until telemetry comes."""

    batch: int = 64
    """Trajectories per rollout batch (B)."""
    group_size: int = 16
    """Trajectories per task (a GRPO group)."""
    max_trajectory_tokens: int = 32768
    """Longest trajectory, in tokens (L_max)."""
    staleness: int = 1
    """Training steps a rollout may lag behind the weights."""
    turns: float = 30.0
    """Prior: turns per trajectory (S)."""
    new_tokens_per_turn: float = 600.0
    """Prior: tokens each turn adds to the context (delta_L)."""
    generated_tokens_per_turn: float = 250.0
    """Prior: tokens generated per turn (r)."""
    env_s: float = 60.0
    """Prior: environment time over a whole step (T_env), in seconds."""
    theta: float = 0.5
    """Prior: bubble ratio (1 - f) / f, f the share of trajectories decoding (theta)."""
    turn_overhead_s: float = 0.5
    """Prior: per-turn prefill/decode switching cost under colocation (T_over), in seconds."""


@dataclass(frozen=True)
class DecisionConfig:
    """``[decision]``: the PD Decision Engine's hysteresis and limits (§4.3)."""

    mode_switch_threshold: float = 0.10
    """Relative gain needed to switch between colocation and disaggregation."""
    ratio_change_threshold: float = 0.03
    """Relative gain needed to change N_P:N_D."""
    ema_alpha: float = 0.3
    """Weight of a new step's telemetry in the workload profile (EMA)."""
    # Prefill keeps up (§4.2) when its busy time, lambda_P * t_prefill / N_P, is at most this share
    # of the decode-path time (eq. 2); beyond it prefill queues grow and delay decode.
    prefill_max_utilization: float = 0.9
    """Highest share of the decode-path time prefill may be busy (eq. 2), in (0, 1]."""


@dataclass(frozen=True)
class GateConfig:
    """``[gate]``: the benefit-aware gate for borrowing training GPUs (§4.6)."""

    enabled: bool = True
    """Gate borrowing by its benefit."""
    toggle_cost_s: float = 9.44
    """Prior T_toggle, in seconds: activation 6.26 s + return 3.18 s (Table 3)."""


DEFAULT_ENDPOINT = "tcp://127.0.0.1:7440"


@dataclass(frozen=True)
class DaemonConfig:
    """``[daemon]``: pearld itself."""

    endpoint: str = DEFAULT_ENDPOINT
    """Where pearld's API listens (loopback or ipc:// unless CURVE keys are given)."""
    keys_dir: str = ""
    """CURVE keys (``pearl keys generate``); required to bind a non-local address."""
    heartbeat_s: float = 1.0
    """Worker hosts heart-beat this often; dead after 3 missed."""
    tick_s: float = 0.5
    """How often the controller checks deadlines."""
    snapshot_every: int = 1000
    """Log records between snapshots of the table."""
    restart_budget: int = 3
    """Restarts of one worker host before it is given up."""
    restart_backoff_s: float = 1.0
    """First restart delay; doubles per restart."""
    reconcile_grace_s: float = 10.0
    """After a restart, how long workers get to re-register."""
    worker_orphan_s: float = 120.0
    """A worker host exits after pearld is unreachable this long."""
    borrow: Borrow = Borrow.GATED
    """Borrowing of training GPUs: by the gate (eq. 7), always, or never."""
    pd: PD = PD.ADAPTIVE
    """PD mode: chosen by the Decision Engine, or always colocated or disaggregated."""
    metrics: str = ""
    """Prometheus metrics over HTTP at HOST:PORT (port 0: any free port); "": off."""
    metrics_public: bool = False
    """Serve metrics on a non-loopback address (that port has no authentication)."""
    launcher: Launcher = Launcher.LOCAL
    """Where worker hosts run: processes here, or Ray actors on the GPUs' nodes."""
    # A torch host forked from the fork server starts without its ~6 CPU-s of imports.
    fork_hosts: bool = True
    """Local: fork worker hosts from one process that imported the engine once; false: one
    cold subprocess each."""

    def __post_init__(self) -> None:
        _parse_enums(self, "daemon")


@dataclass(frozen=True)
class RayConfig:
    """``[ray]``: where worker hosts run when ``daemon.launcher = "ray"`` (docs/ray.md)."""

    address: str = "auto"
    """The cluster's GCS (HOST:PORT), or "auto": the one started on this machine."""
    namespace: str = "pearl"
    """Namespace of the hosts' detached, named actors."""
    node_events: bool = False
    """Turn node joins, deaths and drains into gpus-added / -reclaimed / -reclaiming events."""
    gpus_label: str = "pearl-gpus"
    """Node label naming the table's GPUs a node holds (pearl-gpus=8-15)."""
    poll_s: float = 0.5
    """How often the node table and the hosts' actors are read."""


@dataclass(frozen=True)
class EngineConfig:
    """``[engine]``: what serves the rollouts on each worker host.

    sglang and vllm: each worker host launches one server; its port is the base port plus the
    worker's first GPU id, so the router side finds every server from the table alone."""

    kind: EngineKind = EngineKind.SIM
    """The engine: simulated, PEARL's torch engine, SGLang or vLLM servers."""
    time_scale: float = 0.01
    """sim: a simulated second takes this many real seconds."""
    preset: str = "tiny"
    """torch: model preset (tiny, small, qwen3-0.6b) or a local model directory."""
    device: str = "cpu"
    """torch: the torch device."""
    threads: int = 1
    """torch: threads per worker host."""
    # Each GPU id is a virtual device held by the engine (and the demo trainer) idling after
    # each step, one torch thread per slot; `pearl demo` sizes it to the cores it finds.
    device_share: float | None = None
    """torch: each GPU id is a virtual device of this share of one core; unset: unthrottled."""
    kv_budget_mb: float = 64.0
    """torch: KV cache per worker, in MiB."""
    seed: int = 0
    """torch: seed of a preset's random weights."""
    sim_vocab: int = 0
    """sim: token ids are drawn below this (0: the model's vocabulary)."""
    sim_start_s: float = 60.0
    """sim: cold start of a worker (process, model load, warm-up), in seconds."""
    sglang_model_path: str = ""
    """sglang: ``--model-path`` of the servers."""
    sglang_module: str = "sglang.launch_server"
    """sglang: the servers' module (pearl.engines.facade: the torch facade)."""
    sglang_host: str = "127.0.0.1"
    """sglang: host the servers listen on."""
    sglang_port: int = 30000
    """sglang: base port of the servers."""
    sglang_bootstrap_port: int = 8998
    """sglang: the prefill side's PD bootstrap base port (SGLang's default)."""
    sglang_transfer_backend: str = "mooncake"
    """sglang: KV transfer backend, mooncake or nixl."""
    sglang_memory_saver: bool = True
    """sglang: ``--enable-memory-saver``, so that lending a worker frees its memory."""
    sglang_weights_cpu_backup: bool = False
    """sglang: released memory keeps a CPU copy of the weights (resume needs no reload)."""
    sglang_role_switch: RoleSwitch = RoleSwitch.AUTO
    """sglang: ``--enable-pd-role-switch``: auto (SGLang 0.5.21+), on or off."""
    sglang_extra_args: str = ""
    """sglang: appended to every server's launch command."""
    sglang_startup_timeout_s: float = 600.0
    """sglang: how long a server may take to become healthy, in seconds."""
    vllm_model_path: str = ""
    """vllm: a Hugging Face model directory (config, safetensors, tokenizer)."""
    vllm_tokenizer: str = ""
    """vllm: the tokenizer's directory, if not the model's (``--tokenizer``)."""
    vllm_python: str = ""
    """vllm: the servers' interpreter; "": .venv-vllm/bin/python when present."""
    vllm_host: str = "127.0.0.1"
    """vllm: host the servers listen on."""
    vllm_port: int = 31000
    """vllm: base port of the servers."""
    vllm_dtype: str = "bfloat16"
    """vllm: ``--dtype`` of the weights."""
    vllm_max_model_len: int = 2048
    """vllm: ``--max-model-len``: context limit in tokens."""
    vllm_enforce_eager: bool = True
    """vllm: no CUDA graphs or compilation, so a server starts in seconds."""
    # Off by default: on CPUs vLLM 0.32 kills its engine when it chunks the prefill of a seeded
    # request ("CPU Generator does not use offset").
    vllm_chunked_prefill: bool = False
    """vllm: chunked prefill (turn it on for GPUs)."""
    vllm_sleep_mode: bool = False
    """vllm: ``--enable-sleep-mode`` (CUDA only): lending a worker frees device memory."""
    vllm_kv_cache_mb: int = 512
    """vllm: each server's KV cache, in MiB; 0: vLLM's default (92% of RAM on CPUs)."""
    vllm_extra_args: str = ""
    """vllm: appended to every server's launch command."""
    vllm_startup_timeout_s: float = 600.0
    """vllm: how long a server may take to become healthy, in seconds."""
    router: RouterKind = RouterKind.PEARL
    """What routes requests: PEARL's own Router, or the real sglang-router."""
    sglang_router_urls: str = ""
    """sglang-router: "REGULAR_URL,PD_URL" of running routers; "": launch both."""
    sglang_router_port: int = 29100
    """sglang-router: launched routers' port (regular mode; PD mode on the next port)."""

    def __post_init__(self) -> None:
        _parse_enums(self, "engine")

    @property
    def colocated_only(self) -> bool:
        """vLLM pools serve colocated only: no prefill-decode hand-off through a vLLM KV
        connector on this platform (docs/vllm.md)."""
        return self.kind is EngineKind.VLLM


@dataclass(frozen=True)
class RLConfig:
    """``[rl]``: the Pipeline Scheduler's environment and sampling."""

    env: str = ""
    """The environment the Pipeline Scheduler runs, a name or ``module:Factory``; "": none."""
    tasks: int = 256
    """Size of the environment's task set."""
    seed: int = 0
    """Seed of the task order and sampling."""
    max_turns: int = 0
    """Turns per trajectory (0: the environment's default)."""
    max_new_tokens: int = 48
    """Tokens generated per turn, at most."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling: top-p."""


@dataclass(frozen=True)
class DemoConfig:
    """``[demo]``: what ``pearl demo`` runs on top of the runtime (its flags override)."""

    env: str = "tool_use_counts"
    """The environment the demo learns on ("": ``rl.env`` as it is)."""
    warm_start: bool = True
    """A supervised warm start first (tool_use_counts only)."""
    eval_every: int = 4
    """Held-out evaluation every N training steps, and after the last (0: none)."""
    segment: str = "S2"
    """The Bamboo trace segment the preemptible workers follow."""
    budget: str = ""
    """Scripted budget instead of the segment: "STEP:N,..." preemptible GPUs from STEP on."""
    trace_s: float = 0.0
    """Seconds the segment is squeezed into (``--trace-s``); 0: 4 s per step."""


def parse_budget(text: str, preemptible: int, where: str = "demo.budget") -> list[tuple[int, int]]:
    """``"1:0,5:2,11:0"`` -> [(1, 0), (5, 2), (11, 0)]: steps strictly increasing from 1,
    counts within the ``preemptible`` GPUs."""
    out: list[tuple[int, int]] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        step, sep, n = part.partition(":")
        try:
            pair = (int(step), int(n))
        except ValueError:
            pair = (0, -1)
        if not sep or pair[0] < 1 or pair[1] < 0:
            raise ConfigError(
                f"{where}: {part!r} is not STEP:COUNT (a training step >= 1 and a number of "
                'preemptible GPUs >= 0), e.g. "1:0,5:2,11:0"'
            )
        if out and pair[0] <= out[-1][0]:
            raise ConfigError(f"{where}: steps must increase; {part!r} follows step {out[-1][0]}")
        if pair[1] > preemptible:
            raise ConfigError(
                f"{where}: {part!r} asks for {pair[1]} preemptible GPUs; "
                f"cluster.preemptible_gpus has {preemptible}"
            )
        out.append(pair)
    return out


@dataclass(frozen=True)
class GatewayConfig:
    """``[gateway]``: the OpenAI-compatible HTTP gateway in front of the elastic pool."""

    listen: str = ""
    """Where the gateway listens, HOST:PORT (port 0: any free port); "": off."""
    api_key_file: str = ""
    """A file holding the API key clients send as a bearer token; "": none (loopback only)."""
    model: str = ""
    """The model id the gateway serves and requests must name; "": the engine preset's name."""
    max_body_bytes: int = 1 << 20
    """Largest request body accepted, in bytes."""
    max_streams: int = 256
    """Generation requests (chat, completions, ``/generate``), streamed or not, served at once;
    more are refused with 429 and ``Retry-After``."""
    request_timeout_s: float = 120.0
    """How long a request waits for a worker able to serve it (its worker died, none can start,
    the pool is empty) before it fails with 503 and ``Retry-After``."""
    max_connections: int = 1024
    """Open HTTP connections at once, never more than a quarter of the open-file limit (pearld
    raises its soft limit to the hard one at start); one more is answered 429 and closed."""
    header_timeout_s: float = 10.0
    """A request's head (request line and headers) must arrive within this, counted from the
    connection's open or the previous response's end; else 408 and the connection closes."""
    body_timeout_s: float = 30.0
    """A request's body must arrive within this once its head did; else 408 and the connection
    closes."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins (``scheme://host[:port]``) allowed to call the gateway, with CORS answers;
    a request with any other ``Origin`` header is refused with 403. A TOML list, or a
    comma-separated string on the command line."""


MAX_FILE_BYTES = 64 << 10
"""Largest file a config names (an API key) that PEARL reads."""
MAX_CONFIG_BYTES = 1 << 20
"""Largest config file PEARL reads."""
MAX_SECONDS = 365 * 86400.0
"""Longest duration a ``*_s`` key may give: a year (a longer wait overflows the clocks' APIs)."""

POSITIVE: dict[str, tuple[str, ...]] = {
    "cluster": ("tp",),
    "workload": ("batch", "group_size", "max_trajectory_tokens"),
    "daemon": (
        "heartbeat_s",
        "tick_s",
        "snapshot_every",
        "restart_backoff_s",
        "reconcile_grace_s",
        "worker_orphan_s",
    ),
    "engine": (
        "time_scale",
        "threads",
        "kv_budget_mb",
        "vllm_max_model_len",
        "sglang_startup_timeout_s",
        "vllm_startup_timeout_s",
    ),
    "ray": ("poll_s",),
    "rl": ("tasks", "max_new_tokens"),
    "gateway": (
        "max_body_bytes",
        "max_streams",
        "request_timeout_s",
        "max_connections",
        "header_timeout_s",
        "body_timeout_s",
    ),
}
"""Keys that must be > 0 (counts of things that must exist, periods, timeouts)."""

NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "workload": (
        "staleness",
        "turns",
        "new_tokens_per_turn",
        "generated_tokens_per_turn",
        "env_s",
        "theta",
        "turn_overhead_s",
    ),
    "decision": ("mode_switch_threshold", "ratio_change_threshold"),
    "gate": ("toggle_cost_s",),
    "daemon": ("restart_budget",),
    "engine": ("seed", "sim_vocab", "sim_start_s", "vllm_kv_cache_mb"),
    "rl": ("seed", "max_turns", "temperature"),
    "demo": ("eval_every", "trace_s"),
}
"""Keys that must be >= 0 (0 has a meaning: none, off, the default). Every float key of every
section must also be finite, and every ``*_s`` key at most :data:`MAX_SECONDS`."""

_FIX = "set a number (a TOML float such as 0.5, or an int)"


def _range_problem(name: str, value: Any, default: Any, sign: str) -> str | None:
    """Why ``value`` of key ``name`` is out of range, or None; ``sign``: ">", ">=" or ""."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}; {_FIX} (default {default!r})"
    if sign == ">" and value <= 0 or sign == ">=" and value < 0:
        least = ">= 1" if sign == ">" and isinstance(value, int) else f"{sign} 0"
        return f"{name} must be {least}, got {value!r}; set it to e.g. its default, {default!r}"
    if name.endswith("_s") and value > MAX_SECONDS:
        return (
            f"{name} must be at most {MAX_SECONDS:.0f} s (a year), got {value!r}; "
            f"set a shorter duration (default {default!r})"
        )
    return None


def read_small_file(path: str | Path, where: str, limit: int = MAX_FILE_BYTES) -> str:
    """The text of the regular file ``path``, at most ``limit`` bytes. A device (``/dev/zero``),
    a FIFO or a directory is refused before it is read (it could block the start forever, or
    never end), and so is a larger file: one :class:`ConfigError` line naming ``where``."""
    shown = f"{where} = {str(path)!r}"
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; reads of a regular file ignore it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"{shown}: not a regular file (a device, FIFO or directory); name a file")
    with os.fdopen(fd, "rb") as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise ConfigError(f"{shown}: cannot read it ({e.strerror or e})") from None
    if len(data) > limit:
        raise ConfigError(f"{shown}: larger than {limit} bytes; name the right file")
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise ConfigError(f"{shown}: not UTF-8 text ({e.reason} at byte {e.start})") from None


@dataclass(frozen=True)
class Config:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    def validate(self) -> Config:
        self._check_ranges()
        c = self.cluster
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
            raise ConfigError(
                f"cluster.initial_preemptible {sorted(extra)} are not preemptible GPUs"
            )
        if not 0.0 < c.mem_fraction <= 1.0:
            raise ConfigError(f"cluster.mem_fraction must be in (0, 1], got {c.mem_fraction}")
        d = self.decision
        if not 0.0 < d.prefill_max_utilization <= 1.0:
            raise ConfigError(
                "decision.prefill_max_utilization must be in (0, 1], "
                f"got {d.prefill_max_utilization}"
            )
        if not 0.0 < d.ema_alpha <= 1.0:
            raise ConfigError(f"decision.ema_alpha must be in (0, 1], got {d.ema_alpha}")
        if d.mode_switch_threshold < 0 or d.ratio_change_threshold < 0:
            raise ConfigError("decision thresholds must be >= 0")
        if self.daemon.metrics:
            parse_address(self.daemon.metrics)
            check_exposure(self.daemon.metrics, self.daemon.metrics_public)
        self._check_nodes()
        self._check_gateway()
        if self.engine.colocated_only and self.daemon.pd is PD.DISAGGREGATED:
            raise ConfigError(
                "engine.kind = 'vllm' serves colocated only (no prefill-decode hand-off through "
                "a vLLM KV connector on this platform, docs/vllm.md); set daemon.pd = "
                "'colocated' or 'adaptive'"
            )
        if self.engine.device_share is not None:
            self._check_devices()
        parse_budget(self.demo.budget, len(c.preemptible_gpus))
        return self

    def _check_ranges(self) -> None:
        """Every number of every section is finite; :data:`POSITIVE` keys are > 0,
        :data:`NON_NEGATIVE` ones >= 0, durations at most :data:`MAX_SECONDS`."""
        for sf in dataclasses.fields(self):
            section = getattr(self, sf.name)
            for f in dataclasses.fields(section):
                if f.name in POSITIVE.get(sf.name, ()):
                    sign = ">"
                elif f.name in NON_NEGATIVE.get(sf.name, ()):
                    sign = ">="
                else:
                    sign = ""
                default = f.default if f.default is not dataclasses.MISSING else None
                value = getattr(section, f.name)
                why = _range_problem(f"{sf.name}.{f.name}", value, default, sign)
                if why is not None:
                    raise ConfigError(why)

    def _check_gateway(self) -> None:
        g = self.gateway
        for origin in g.allowed_origins:
            if not re.fullmatch(r"https?://[^/\s?#@]+", origin.strip().rstrip("/")):
                raise ConfigError(
                    f"gateway.allowed_origins: {origin!r} is not an origin; expected "
                    'scheme://host[:port], e.g. "http://localhost:3000"'
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

    def _check_nodes(self) -> None:
        """Each [[cluster.nodes]] entry names one node and holds GPUs of the table, no two the
        same GPU."""
        c = self.cluster
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

    def _check_devices(self) -> None:
        """Virtual devices: a share in (0, 1], on the torch engine, all slots within the cores."""
        e, c = self.engine, self.cluster
        share = check_share(e.device_share, "engine.device_share")  # type: ignore[arg-type]
        if e.kind is not EngineKind.TORCH:
            raise ConfigError(
                f"engine.device_share = {share:g} models a device on the torch engine; "
                f"engine.kind = {e.kind.value!r} does not run on this machine's cores. Remove it"
            )
        if e.threads != 1:
            raise ConfigError(
                f"engine.device_share = {share:g} holds one torch thread per slot; "
                f"engine.threads = {e.threads}. Set engine.threads = 1"
            )
        if c.tp * share > 1.0:
            raise ConfigError(
                f"engine.device_share = {share:g} with cluster.tp = {c.tp}: a worker of {c.tp} "
                f"slots needs {c.tp * share:.2f} of its one thread's core; use at most "
                f"{1 / c.tp:.3f}"
            )
        slots = len(c.training_gpus) + len(c.reserved_gpus) + len(c.preemptible_gpus)
        check_fits(share, slots, available_cores(), "engine.device_share")


def _member(tp: type[enum.StrEnum], value: Any, where: str) -> Any:
    """``value`` as a member of ``tp``: the string a TOML file or ``--set`` gives, or a member."""
    if isinstance(value, tp):
        return value
    options = [m.value for m in tp]
    if isinstance(value, str) and value in options:
        return tp(value)
    raise ConfigError(
        f"{where} = {value!r}; expected one of {', '.join(options)}{_suggest(str(value), options)}"
    )


def _parse_enums(section: Any, name: str) -> None:
    """Turn a section's enum fields, given as strings, into their members (the section is
    frozen: a direct ``EngineConfig(kind="torch")`` or a JSON copy is parsed here too)."""
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        tp = hints[f.name]
        if isinstance(tp, type) and issubclass(tp, enum.StrEnum):
            value = getattr(section, f.name)
            object.__setattr__(section, f.name, _member(tp, value, f"{name}.{f.name}"))


def _section_types() -> dict[str, type]:
    hints = typing.get_type_hints(Config)
    return {f.name: hints[f.name] for f in dataclasses.fields(Config)}


def _suggest(name: str, options: list[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1)
    return f"; did you mean {close[0]!r}?" if close else f"; valid: {', '.join(sorted(options))}"


def _coerce(value: Any, tp: Any, where: str) -> Any:
    optional = [a for a in typing.get_args(tp) if a is not type(None)]
    if isinstance(tp, types.UnionType) and len(optional) == 1:
        tp = optional[0]  # `float | None`: TOML has no null, so a given value is the type
    if tp is GpuList or tp == GpuList:
        return parse_gpus(value, where)
    args = typing.get_args(tp)
    if (
        typing.get_origin(tp) is tuple
        and args[-1:] == (Ellipsis,)
        and dataclasses.is_dataclass(args[0])
    ):  # an array of tables: [[cluster.nodes]]
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(f"{where}: expected an array of tables ([[...]])")
        return tuple(_table(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if typing.get_origin(tp) is tuple and args == (str, Ellipsis):  # a list of strings
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) for v in items):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        return tuple(v.strip() for v in items if v.strip())
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: expected a finite number, got {value!r}; {_FIX}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif isinstance(tp, type) and issubclass(tp, enum.StrEnum):
        return _member(tp, value, where)
    else:
        raise ConfigError(f"{where}: unsupported type {tp}")
    raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")


def _table(cls: Any, body: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    keys = [f.name for f in dataclasses.fields(cls)]
    for key in body:
        if key not in hints:
            raise ConfigError(f"{where}: unknown key {key}{_suggest(key, keys)}")
    return cls(**{k: _coerce(v, hints[k], f"{where}.{k}") for k, v in body.items()})


def from_mapping(
    data: dict[str, Any],
    source: str = "config",
    origins: dict[tuple[str, str], str] | None = None,
) -> Config:
    """Build a validated Config from a TOML-like mapping; unknown names are errors.

    ``origins`` names where a value came from when not from ``source``: ``(section, key)`` (or
    ``(section, "")`` for a whole section) -> e.g. ``"--set engine.x=1"``."""
    sections = _section_types()
    origins = origins or {}
    built: dict[str, Any] = {}
    for sname, body in data.items():
        if sname not in sections:
            where = origins.get((sname, ""), source)
            raise ConfigError(
                f"{where}: unknown section [{sname}]{_suggest(sname, list(sections))}"
            )
        if not isinstance(body, dict):
            raise ConfigError(f"{source}: [{sname}] must be a table")
        cls = sections[sname]
        hints = typing.get_type_hints(cls)
        keys = [f.name for f in dataclasses.fields(cls)]
        kwargs = {}
        for key, value in body.items():
            where = origins.get((sname, key), source)
            if key not in hints:
                raise ConfigError(f"{where}: unknown key {sname}.{key}{_suggest(key, keys)}")
            kwargs[key] = _coerce(value, hints[key], f"{where}: {sname}.{key}")
        built[sname] = cls(**kwargs)
    return Config(**built).validate()


def parse_override(text: str) -> tuple[str, str, Any]:
    """``section.key=value`` with the value read as a TOML literal (bare words are strings)."""
    path, eq, raw = text.partition("=")
    section, dot, key = path.strip().partition(".")
    if not eq or not dot or not section or not key:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return section, key, value


def load(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file (or the defaults when ``path`` is None) and apply overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(read_small_file(p, "--config", MAX_CONFIG_BYTES))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{p}: not valid TOML: {e}") from None
    origins: dict[tuple[str, str], str] = {}  # a typo in --set is not the file's
    for text in overrides:
        section, key, value = parse_override(text)
        if section not in data:
            origins[(section, "")] = f"--set {text.strip()}"
        data.setdefault(section, {})
        if not isinstance(data[section], dict):
            raise ConfigError(f"--set {text!r}: {section} is not a section")
        data[section][key] = value
        origins[(section, key)] = f"--set {text.strip()}"
    return from_mapping(data, source, origins)


__all__ = [
    "DEFAULT_ENDPOINT",
    "ClusterConfig",
    "Config",
    "DaemonConfig",
    "DecisionConfig",
    "DemoConfig",
    "EngineConfig",
    "EngineKind",
    "GateConfig",
    "Launcher",
    "ModelConfig",
    "NodeConfig",
    "RLConfig",
    "RayConfig",
    "RoleSwitch",
    "RouterKind",
    "WorkloadConfig",
    "available_cores",
    "from_mapping",
    "load",
    "parse_budget",
    "read_small_file",
    "parse_gpus",
    "parse_override",
]
