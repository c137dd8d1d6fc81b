"""Hardware specs, model architectures and a roofline: the priors of the workload profile.

Before any telemetry the PD Decision Engine (§4.3) needs A, b, t_prefill, K, K_seq, H_max and BW.
They follow from public datasheets and published model configs: decode is bound by HBM reads
(weights once per iteration, each sequence's KV cache once per iteration), prefill by tensor-core
FLOPs. The efficiency factors below turn peak numbers into sustained ones; the Runtime Tracker
replaces these priors with fitted values after the first rollout steps (§4.3.2).
"""

from __future__ import annotations

import difflib
from typing import TypeVar

from pearl.core.errors import ConfigError, InfeasibleConfiguration
from pearl.core.schema import Value

GB = 1e9

# -- efficiency factors (sustained / peak) ------------------------------------------------------
# Decode GEMVs and paged-attention kernels stream HBM at roughly 80% of peak on Hopper/Ampere.
HBM_EFFICIENCY = 0.8
# Append-prefill over a long cached prefix (attention-heavy, chunked) sustains about 45% MFU.
PREFILL_MFU = 0.45
# The extra FLOPs one more decoding sequence adds run as skinny GEMMs: about 30% MFU.
DECODE_MFU = 0.3
# A KV transfer between pools (RDMA, Mooncake/NIXL-style) reaches about 80% of the link rate.
LINK_EFFICIENCY = 0.8
# Share of a worker's HBM the engine may use for weights plus KV cache (SGLang's
# --mem-fraction-static is of this order); the rest is activations, CUDA graphs, fragmentation.
MEM_FRACTION = 0.9
# Per-iteration floor with CUDA graphs: about ten kernels per layer at ~1.5 us each ...
LAUNCH_S_PER_LAYER = 15e-6
# ... plus two tensor-parallel all-reduces per layer, ~8 us each for decode-sized messages.
ALLREDUCE_S = 8e-6
# Decode batch per worker at which MoE expert coverage is estimated (see ModelSpec.weights_read).
TYPICAL_DECODE_BATCH = 16
BYTES_PER_PARAM = 2  # bf16 weights
BYTES_PER_KV = 2  # bf16 KV cache


class GpuSpec(Value, frozen=True, kw_only=True):
    """One GPU: dense bf16 FLOP/s, HBM bytes/s and bytes, one-way link bytes/s."""

    name: str
    flops: float  # dense bf16 tensor FLOP/s (no sparsity)
    hbm_Bps: float
    hbm_bytes: float
    intra_node_Bps: float  # NVLink, one direction (datasheets quote both directions summed)
    inter_node_Bps: float  # the GPU's own NIC (rail-optimised HGX: one NIC per GPU)


# NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 TFLOPS *with sparsity* -> 989.4 dense;
# 80 GB HBM3 at 3.35 TB/s; NVLink 900 GB/s (bidirectional). DGX H100: 8x ConnectX-7 400 Gb/s.
_H100 = GpuSpec(
    name="H100",
    flops=989.4e12,
    hbm_Bps=3.35e12,
    hbm_bytes=80 * GB,
    intra_node_Bps=450 * GB,
    inter_node_Bps=50 * GB,
)
GPUS: dict[str, GpuSpec] = {
    "H100": _H100,
    # H800 SXM5 (China export variant): H100 SXM compute, memory and HBM bandwidth, NVLink cut to
    # 400 GB/s bidirectional. The paper's cluster (§6.1) links nodes with 800 Gbps InfiniBand.
    "H800": GpuSpec(
        name="H800",
        flops=_H100.flops,
        hbm_Bps=_H100.hbm_Bps,
        hbm_bytes=_H100.hbm_bytes,
        intra_node_Bps=200 * GB,
        inter_node_Bps=50 * GB,
    ),
    # NVIDIA H200 datasheet (SXM): same tensor cores as H100 (989 TFLOPS dense BF16), 141 GB HBM3e
    # at 4.8 TB/s, NVLink 900 GB/s.
    "H200": GpuSpec(
        name="H200",
        flops=_H100.flops,
        hbm_Bps=4.8e12,
        hbm_bytes=141 * GB,
        intra_node_Bps=450 * GB,
        inter_node_Bps=50 * GB,
    ),
    # NVIDIA A100 datasheet (SXM4 80GB): BF16 312 TFLOPS dense, HBM2e 2,039 GB/s, NVLink 600 GB/s;
    # DGX A100: 8x ConnectX-6 HDR 200 Gb/s.
    "A100": GpuSpec(
        name="A100",
        flops=312e12,
        hbm_Bps=2.039e12,
        hbm_bytes=80 * GB,
        intra_node_Bps=300 * GB,
        inter_node_Bps=25 * GB,
    ),
    # Not a datasheet: a rough two-core laptop/CI CPU for the CPU test engine and `make demo`.
    "CPU": GpuSpec(
        name="CPU",
        flops=50e9,
        hbm_Bps=10 * GB,
        hbm_bytes=4 * GB,
        intra_node_Bps=10 * GB,
        inter_node_Bps=1 * GB,
    ),
}


class ModelSpec(Value, frozen=True, kw_only=True):
    """A decoder-only transformer as its config.json describes it (Qwen3 layout: GQA, SwiGLU)."""

    name: str
    layers: int
    hidden: int
    intermediate: int  # dense MLP width (unused when every layer is MoE)
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int = 0  # 0: dense
    active_experts: int = 0
    moe_intermediate: int = 0
    tied_embeddings: bool = False

    @property
    def attention_params(self) -> int:
        q_and_o = 2 * self.hidden * self.heads * self.head_dim
        k_and_v = 2 * self.hidden * self.kv_heads * self.head_dim
        norms = 2 * self.hidden + 2 * self.head_dim  # input/post RMSNorm, q_norm/k_norm
        return q_and_o + k_and_v + norms

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * (self.moe_intermediate if self.experts else self.intermediate)

    def layer_params(self, experts: float | None = None) -> float:
        """Parameters of one layer with ``experts`` experts resident (default: all)."""
        if not self.experts:
            return self.attention_params + self.expert_params
        n = self.experts if experts is None else experts
        return self.attention_params + self.hidden * self.experts + n * self.expert_params

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def total_params(self) -> float:
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.layer_params() + heads * self.embedding_params + self.hidden

    @property
    def active_params(self) -> float:
        """Parameters one token's forward pass multiplies by (embeddings lookups excluded)."""
        return self.layers * self.layer_params(self.active_experts) + self.embedding_params

    def weights_read(self, decode_batch: float) -> float:
        """Weight bytes one decode iteration of ``decode_batch`` sequences streams from HBM.

        Dense: every layer plus the LM head. MoE: the experts the batch touches; with k of E
        experts per token, E * (1 - (1 - k/E)^n) distinct experts are expected per layer.
        """
        if self.experts:
            k, e = self.active_experts, self.experts
            touched = e * (1.0 - (1.0 - k / e) ** max(decode_batch, 1.0))
            layer = self.layer_params(touched)
        else:
            layer = self.layer_params()
        return (self.layers * layer + self.embedding_params) * BYTES_PER_PARAM

    def attention_flops(self, context: float) -> float:
        """FLOPs of one token attending to ``context`` cached tokens (QK^T and PV)."""
        return 4.0 * self.layers * self.heads * self.head_dim * context

    @property
    def K(self) -> int:
        """KV-cache bytes per token: 2 (K and V) x layers x kv_heads x head_dim x 2 bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * BYTES_PER_KV


# Values from each model's published config.json (Hugging Face Qwen/<name>).
MODELS: dict[str, ModelSpec] = {
    "qwen3-0.6b": ModelSpec(
        name="qwen3-0.6b",
        layers=28,
        hidden=1024,
        intermediate=3072,
        heads=16,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
        tied_embeddings=True,
    ),
    "qwen3-8b": ModelSpec(
        name="qwen3-8b",
        layers=36,
        hidden=4096,
        intermediate=12288,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=151936,
    ),
    "qwen3-30b-a3b": ModelSpec(
        name="qwen3-30b-a3b",
        layers=48,
        hidden=2048,
        intermediate=6144,
        heads=32,
        kv_heads=4,
        head_dim=128,
        vocab=151936,
        experts=128,
        active_experts=8,
        moe_intermediate=768,
    ),
    # What the CPU test engine runs: a Qwen3-architecture model small enough for two cores.
    "qwen3-tiny": ModelSpec(
        name="qwen3-tiny",
        layers=2,
        hidden=64,
        intermediate=128,
        heads=4,
        kv_heads=2,
        head_dim=16,
        vocab=512,
        tied_embeddings=True,
    ),
}


_T = TypeVar("_T")


def _lookup(table: dict[str, _T], key: str, what: str) -> _T:
    if key in table:
        return table[key]
    close = difflib.get_close_matches(key, list(table), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(f"unknown {what} {key!r}{hint} (known: {', '.join(sorted(table))})")


def gpu_spec(name: str) -> GpuSpec:
    """The spec of a GPU by name, case-insensitive ("h800" -> H800)."""
    return _lookup(GPUS, name.upper(), "GPU")


def model_spec(name: str) -> ModelSpec:
    """The architecture of a model by name, case-insensitive ("Qwen3-8B" -> qwen3-8b)."""
    return _lookup(MODELS, name.lower(), "model")


class Roofline(Value, frozen=True, kw_only=True):
    """Platform parameters of the makespan models for one (model, GPU, tp) worker."""

    t_prefill: float  # s per prefill token on one worker
    A: float  # s, fixed cost of one decode iteration
    b: float  # s, marginal cost of one more sequence in a decode iteration
    K: float  # KV bytes per token
    K_seq: float  # KV bytes per trajectory at seq_tokens
    H_max: float  # KV bytes one worker can hold
    BW: float  # bytes/s between the prefill and decode pools
    weight_bytes: float  # resident weights per worker (all experts)


def roofline(
    model: str | ModelSpec,
    gpu: str | GpuSpec,
    tp: int,
    *,
    context: float,
    seq_tokens: float,
    mem_fraction: float = MEM_FRACTION,
    decode_batch: float = TYPICAL_DECODE_BATCH,
    same_node: bool = False,
) -> Roofline:
    """The catalog priors: roofline estimates of t_prefill, A, b, K, K_seq, H_max and BW.

    ``context`` is the typical cached context a token attends to (sets the per-sequence KV read
    in b and the attention share of t_prefill); ``seq_tokens`` the context a trajectory reaches
    (K_seq). A worker spans ``tp`` GPUs. BW is one worker's links (``tp`` NICs, or NVLink when
    both pools share a node): a conservative stand-in for the pool-to-pool bandwidth of eq. 3.
    """
    m = model if isinstance(model, ModelSpec) else model_spec(model)
    g = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
    if tp < 1:
        raise ConfigError(f"tensor-parallel degree must be >= 1, got {tp}")
    if not (0.0 < mem_fraction <= 1.0):
        raise ConfigError(f"mem_fraction must be in (0, 1], got {mem_fraction}")
    if context < 0 or seq_tokens < 0:
        raise ConfigError("context and seq_tokens must be >= 0")
    flops = tp * g.flops
    hbm = tp * g.hbm_Bps * HBM_EFFICIENCY
    # Prefill computes logits for the last token only: no LM head per token.
    dense_flops = 2.0 * (m.active_params - m.embedding_params)
    t_prefill = (dense_flops + m.attention_flops(context)) / (flops * PREFILL_MFU)
    floor = m.layers * LAUNCH_S_PER_LAYER + (2 * m.layers * ALLREDUCE_S if tp > 1 else 0.0)
    A = m.weights_read(decode_batch) / hbm + floor
    per_seq_flops = 2.0 * m.active_params + m.attention_flops(context)
    b = m.K * context / hbm + per_seq_flops / (flops * DECODE_MFU)
    weight_bytes = m.total_params * BYTES_PER_PARAM
    usable = tp * g.hbm_bytes * mem_fraction
    H_max = usable - weight_bytes
    if H_max <= 0:
        raise InfeasibleConfiguration(
            f"{m.name} weights ({weight_bytes / GB:.1f} GB) do not fit in {tp} x {g.name} at "
            f"mem_fraction {mem_fraction} ({usable / GB:.1f} GB); raise the tensor-parallel degree"
        )
    link = g.intra_node_Bps if same_node else g.inter_node_Bps
    BW = tp * link * LINK_EFFICIENCY
    return Roofline(
        t_prefill=t_prefill,
        A=A,
        b=b,
        K=float(m.K),
        K_seq=float(m.K * seq_tokens),
        H_max=H_max,
        BW=BW,
        weight_bytes=weight_bytes,
    )


__all__ = [
    "GPUS",
    "MODELS",
    "GpuSpec",
    "ModelSpec",
    "Roofline",
    "gpu_spec",
    "model_spec",
    "roofline",
]
