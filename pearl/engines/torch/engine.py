"""The ``torch`` engine: a Qwen3-architecture model from ``transformers`` on CPU (or CUDA).

``TorchEngine(preset="tiny", role=Role.COLOCATED, kv_channel=None, device="cpu",
kv_budget_bytes=64 << 20, threads=1, ...)`` builds the model at ``start()``; every keyword is a
field of :class:`TorchEngineConfig`. The shared serving loop (continuous batching, chunked prefill,
trajectory prefix reuse, PD roles) drives a :class:`PagedRunner` that owns the K/V pages.
``device_share=0.2`` makes the engine a virtual device of a fifth of one core
(:mod:`pearl.engines.device`): every forward step idles in proportion to its compute.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from pearl.core.state import Role
from pearl.engines.base import EngineError, KVChannel
from pearl.engines.device import VirtualDevice
from pearl.engines.in_process import InProcessEngine, ServingConfig
from pearl.engines.sequence import Sample, Segment, Seq
from pearl.engines.torch import model as M
from pearl.engines.torch.constrain import masked
from pearl.engines.torch.runner import PagedRunner
from pearl.engines.torch.sampling import Row, generator_for, sample
from pearl.engines.torch.wire import from_frames, to_frames
from pearl.tokenizer import Tokenizer, load_tokenizer


@dataclass(frozen=True)
class TorchEngineConfig(ServingConfig):
    preset: str = "tiny"  # a key of PRESETS; ignored when model_path is set
    model_path: str = ""  # a local Hugging Face Qwen3 directory (config + weights)
    tokenizer_path: str = ""  # a local HF tokenizer; default: model_path's, else byte-level
    seed: int = 0  # random weights of a preset
    device: str = "cpu"  # "cpu", "cuda", "cuda:1" or "auto"
    dtype: str = "auto"  # "auto" = float32 on CPU, bfloat16 on CUDA
    threads: int = 1  # torch intra-op threads (process-wide: one engine per worker process)
    keep_cpu_copy: bool = False  # release_memory keeps a CPU copy of the weights to resume from
    device_share: float | None = None  # a virtual device of this share of one core; None: all


class TorchEngine(InProcessEngine):
    kind = "torch"

    def __init__(
        self,
        config: TorchEngineConfig | None = None,
        *,
        role: Role = Role.COLOCATED,
        kv_channel: KVChannel | None = None,
        **overrides: Any,
    ) -> None:
        known = {f.name for f in dataclasses.fields(TorchEngineConfig)}
        if bad := sorted(set(overrides) - known):
            raise EngineError(f"unknown TorchEngine option(s) {bad}; known: {sorted(known)}")
        cfg = dataclasses.replace(config or TorchEngineConfig(), **overrides)
        super().__init__(cfg, role, kv_channel)
        self.tcfg = cfg
        self.device = M.resolve_device(cfg.device)
        self.dtype = M.resolve_dtype(cfg.dtype, self.device)
        self.hf_config, self._source = M.model_of(cfg.model_path, cfg.preset, cfg.seed)
        self.vocab_size = int(self.hf_config.vocab_size)  # its embedding: ids beyond fail
        self.tokenizer: Tokenizer = load_tokenizer(cfg.tokenizer_path or cfg.model_path or None)
        self.model: Any = None
        self.runner: PagedRunner | None = None
        self._cpu_copy: dict[str, torch.Tensor] | None = None
        self.virtual_device: VirtualDevice | None = None
        if cfg.device_share is not None:
            if cfg.threads != 1:
                raise EngineError(
                    f"device_share={cfg.device_share} holds one torch thread per slot; got "
                    f"threads={cfg.threads}: pass threads=1"
                )
            self.virtual_device = VirtualDevice(cfg.device_share)

    # -- building and memory -------------------------------------------------------------------

    def _bytes_per_token(self) -> int:
        return M.kv_bytes_per_token(self.hf_config, self.dtype)

    def _context_limit(self) -> int:
        return int(self.hf_config.max_position_embeddings)

    def _backend_start(self) -> None:
        torch.set_num_threads(self.tcfg.threads)
        self.model = M.build(
            config=self.hf_config, source=self._source, device=self.device, dtype=self.dtype
        )

    def _allocate_kv(self, n_pages: int) -> None:
        self.runner = PagedRunner(
            model=self.model,
            n_pages=n_pages,
            page_size=self.cfg.page_size,
            max_seq_len=self.max_seq_len,
        )

    def _free_device(self) -> None:
        if self.tcfg.keep_cpu_copy and self.model is not None:
            self._cpu_copy = {
                k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()
            }
        self.model = self.runner = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _restore_device(self) -> None:
        source = self._source
        if self._cpu_copy is not None:
            source, self._cpu_copy = M.WeightSource("state", self._cpu_copy), None
        elif self._pending_weights is not None:
            # A newer version waits to be applied: build from it, not from the snapshot loaded
            # before the release, which the weight store may have pruned since.
            source = self._source = M.source_of(self._pending_weights[1])
            self._pending_weights = None
        self.model = M.build(
            config=self.hf_config, source=source, device=self.device, dtype=self.dtype
        )

    def _load(self, version: int, source: Any) -> None:
        src = M.source_of(source)
        if src.kind == "dir":
            self.model = M.build(
                config=self.hf_config, source=src, device=self.device, dtype=self.dtype
            )
            assert self.runner is not None
            self.runner.model = self.model
        else:
            M.load_into(self.model, src)
        self._source = src

    # -- computing -----------------------------------------------------------------------------

    def _new_sequence(self, seq: Seq) -> None:
        seq.state = generator_for(seq.req.sampling)

    def _forward(self, segments: list[Segment]) -> list[Sample]:
        assert self.runner is not None
        if self.virtual_device is None:
            return self._compute(segments)
        # The work: sequences, tokens computed, and their context in 256-token buckets (attention
        # grows with it); the device compares its CPU time with this work's typical cost.
        work = (
            len(segments),
            sum(g.end - g.start for g in segments),
            sum(g.end for g in segments) >> 8,
        )
        with self.virtual_device.step(work):  # CPU time of the step, then idle in proportion
            return self._compute(segments)

    def _compute(self, segments: list[Segment]) -> list[Sample]:
        assert self.runner is not None
        logits = self.runner.forward(segments)
        seqs = [g.seq for g in segments if g.samples]
        under = masked(logits, seqs, self.max_seq_len)  # structured outputs: None if none
        if under is None:
            return sample(logits, [_row(s) for s in seqs])
        return sample(under, [_row(s) for s in seqs], raw=logits)  # raw logprobs, batched

    def _copy_kv(self, source: Seq, target: Seq, n: int) -> None:
        assert self.runner is not None
        self.runner.copy(source, target, n)

    def _export_kv(self, seq: Seq) -> tuple[dict[str, Any], list[Any]]:
        assert self.runner is not None
        tensors = self.runner.export(seq, seq.computed)
        return to_frames({str(i): t for i, t in enumerate(tensors)})

    def _import_kv(self, seq: Seq, meta: dict[str, Any], frames: list[Any]) -> None:
        assert self.runner is not None
        tensors = list(from_frames(meta, frames).values())
        r = self.runner
        want = (seq.computed, r.kv_heads, r.head_dim)
        if len(tensors) != 2 * r.n_layers or any(tuple(t.shape) != want for t in tensors):
            got = [tuple(t.shape) for t in tensors[:1]]
            raise EngineError(
                f"KV of {seq.rid} does not fit this model: {len(tensors)} tensors "
                f"of {got}, expected {2 * r.n_layers} of {want}"
            )
        if tensors[0].dtype != self.dtype:
            raise EngineError(
                f"KV of {seq.rid} is {tensors[0].dtype}, this engine runs "
                f"{self.dtype}; run prefill and decode with one dtype"
            )
        r.write(seq, tensors)


def _row(seq: Seq) -> Row:
    sp = seq.req.sampling
    if sp.plain:
        return Row(sp, seq.state, top=seq.req.top_logprobs)
    prompt, output = seq.history()
    return Row(
        params=sp, generator=seq.state, prompt=prompt, output=output, top=seq.req.top_logprobs
    )


__all__ = ["TorchEngine", "TorchEngineConfig"]
