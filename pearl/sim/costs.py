"""What one simulated rollout worker costs: a per-iteration roofline resolved by batch and context.

The decision engine's closed forms (eq. 1-3) use one A, one b and one t_prefill per step. The
simulator resolves them further, from the same catalog (``pearl.core.catalog``):

- decode iteration of n sequences with contexts c_i: ``A(n) + n c_seq + c_ctx sum(c_i)``, where
  A(n) streams the weights the batch touches (for MoE, the experts n tokens route to: it grows with
  n) plus kernel-launch and all-reduce floors, c_seq is a sequence's share of the FLOPs and c_ctx
  reads one cached token's K and V (plus its attention FLOPs);
- prefill of one token with ``p`` cached tokens before it: ``t_lin + t_att p`` (linear layers plus
  attention to the prefix), chunked ``chunk_tokens`` per iteration;
- KV: ``K`` bytes per token; a worker holds ``kv_tokens`` of them (HBM left after the weights);
- KV transfer between pools: a node's InfiniBand link (``link_Bps``, the paper's 800 Gb/s per
  node) is shared by every transfer entering or leaving the node; within a node NVLink.
- weights: ``weight_bytes`` (all parameters, bf16) move when a new version is published (the
  broadcast stalls the rollout workers for ``weight_bytes / link_Bps``) and when a worker joins
  (it loads the current version from a peer over the link before admission; an overlap worker
  loads it from the trainer on its own node over NVLink).

``EngineParams`` are the knobs calibration may move (efficiencies, chunk size, link rate);
everything else is datasheet and config.json arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from pearl.core import catalog
from pearl.core.catalog import GpuSpec, ModelSpec

MAX_BATCH = 1024  # largest decode batch A(n) is tabulated for


@dataclass(frozen=True)
class EngineParams:
    """Calibrated engine knobs (see docs/simulator.md for how each was set)."""

    gpu: str = "H800"
    tp: int = 2
    hbm_efficiency: float = catalog.HBM_EFFICIENCY
    prefill_mfu: float = catalog.PREFILL_MFU
    decode_mfu: float = catalog.DECODE_MFU
    mem_fraction: float = catalog.MEM_FRACTION
    chunk_tokens: int = 8192  # SGLang's chunked_prefill_size on 80 GB GPUs
    iter_overhead_s: float = 0.0  # scheduler/sampling time per iteration not hidden by overlap
    link_Bps: float = 800e9 / 8 * catalog.LINK_EFFICIENCY  # per node, shared (§6.1: 800 Gb/s IB)
    nvlink_Bps: float = 0.0  # within a node, per transfer; 0: the catalog's NVLink at 80%
    gpus_per_node: int = 8
    xfer_latency_s: float = 0.002  # per KV transfer: handshake, page-table metadata
    decode_keeps_prefix: bool = False  # PD decode workers drop a trajectory's KV after each turn
    pd_affinity: bool = True  # PD router sends a turn back to its prefill worker's cached prefix
    insert_s: float = 0.0  # colocated: fixed cost of inserting a prefill into a running batch
    time_scale: float = 1.0  # every GPU time x this (and environment time: see Scenario)
    sync_weights: bool = True  # publishes and joins pay the weight transfer (False: free)


@dataclass(frozen=True)
class WorkerCosts:
    """Per-worker cost coefficients of one (model, GPU, tp) in seconds, tokens and bytes."""

    model: str
    A_table: tuple[float, ...]  # A(n) for n = 0 .. MAX_BATCH
    A_prefill: float  # fixed cost of a prefill forward (all weights streamed once)
    c_seq: float
    c_ctx: float
    t_lin: float
    t_att: float
    K: float
    kv_tokens: int
    link_Bps: float
    nvlink_Bps: float
    gpus_per_node: int
    chunk_tokens: int
    overhead_s: float
    xfer_latency_s: float
    decode_keeps_prefix: bool
    insert_s: float
    pd_affinity: bool = True
    weight_bytes: float = 0.0  # moved per weight sync (0: weight synchronisation is free)

    def weight_sync_s(self, intra_node: bool = False) -> float:
        """Seconds to move one weight version to a worker: over the node's link (a publish or a
        joiner fetching from a peer) or over NVLink (an overlap worker from its own trainer)."""
        if self.weight_bytes <= 0:
            return 0.0
        return self.weight_bytes / (self.nvlink_Bps if intra_node else self.link_Bps)

    def A(self, n: int) -> float:
        return self.A_table[n if n <= MAX_BATCH else MAX_BATCH]

    def decode_iteration(self, n: int, ctx_sum: float) -> float:
        """Seconds of one decode iteration of n sequences holding ctx_sum context tokens."""
        if n <= 0:
            return 0.0
        return self.A(n) + n * self.c_seq + self.c_ctx * ctx_sum + self.overhead_s

    def prefill_token(self, prefix: float, new: float, colocated: bool = False) -> float:
        """Mean seconds per token of prefilling ``new`` tokens after ``prefix`` cached ones
        (on a colocated worker the insertion overhead is spread over the request's tokens)."""
        t = self.t_lin + self.t_att * (prefix + 0.5 * new)
        return t + self.insert_s / new if colocated and new > 0 else t


def worker_costs(model: str, params: EngineParams | None = None) -> WorkerCosts:
    """The cost coefficients of one TP worker of ``model`` on ``params.gpu`` (catalog priors)."""
    p = params or EngineParams()
    m: ModelSpec = catalog.model_spec(model)
    g: GpuSpec = catalog.gpu_spec(p.gpu)
    k = p.time_scale  # dilates every GPU time: slower FLOPs, HBM and links alike
    flops = p.tp * g.flops / k
    hbm = p.tp * g.hbm_Bps * p.hbm_efficiency / k
    floor = k * (
        m.layers * catalog.LAUNCH_S_PER_LAYER
        + (2 * m.layers * catalog.ALLREDUCE_S if p.tp > 1 else 0.0)
    )
    A_table = tuple((m.weights_read(max(n, 1)) / hbm + floor) for n in range(MAX_BATCH + 1))
    attn_per_ctx = m.attention_flops(1.0)
    weights = m.total_params * catalog.BYTES_PER_PARAM
    kv_bytes = p.tp * g.hbm_bytes * p.mem_fraction - weights
    if kv_bytes <= 0:
        raise ValueError(f"{m.name} does not fit on {p.tp} x {g.name}")
    nvlink = (p.nvlink_Bps or g.intra_node_Bps * catalog.LINK_EFFICIENCY) / k
    return WorkerCosts(
        model=m.name,
        A_table=A_table,
        A_prefill=m.weights_read(float(MAX_BATCH)) / hbm + floor,
        c_seq=2.0 * m.active_params / (flops * p.decode_mfu),
        c_ctx=m.K / hbm + attn_per_ctx / (flops * p.decode_mfu),
        t_lin=2.0 * (m.active_params - m.embedding_params) / (flops * p.prefill_mfu),
        t_att=attn_per_ctx / (flops * p.prefill_mfu),
        K=float(m.K),
        kv_tokens=int(kv_bytes // m.K),
        link_Bps=p.link_Bps / k,
        nvlink_Bps=nvlink,
        gpus_per_node=p.gpus_per_node,
        chunk_tokens=p.chunk_tokens,
        overhead_s=k * p.iter_overhead_s,
        xfer_latency_s=k * p.xfer_latency_s,
        decode_keeps_prefix=p.decode_keeps_prefix,
        insert_s=k * p.insert_s,
        weight_bytes=weights if p.sync_weights else 0.0,
        pd_affinity=p.pd_affinity,
    )


__all__ = ["MAX_BATCH", "EngineParams", "WorkerCosts", "worker_costs"]
