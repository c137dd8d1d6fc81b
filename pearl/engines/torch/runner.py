"""The forward pass over a paged KV cache, driving the Hugging Face Qwen3 modules layer by layer.

The model's own modules (norms, projections, MLP, ``lm_head``) compute; this module owns the K/V:
per layer one tensor ``[pages * page_size, kv_heads, head_dim]``, a token's slot being
``page * page_size + offset``. One iteration runs every token of every segment through the
projections and MLPs as a single flat batch (chunked prefill piggybacked on decode). Attention is
split by shape: all one-token segments (decode) at once, their keys gathered from their pages and
padded with a mask; each multi-token prefill chunk on its own with a causal mask offset by the
tokens already cached.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from pearl.engines.sequence import Segment, Seq


class PagedRunner:
    """Holds the K/V pool and runs one iteration; every method runs on the engine thread."""

    def __init__(self, model: Any, n_pages: int, page_size: int, max_seq_len: int) -> None:
        cfg = model.config
        p = next(model.parameters())
        self.model, self.device, self.dtype = model, p.device, p.dtype
        self.page_size = page_size
        self.n_layers, self.kv_heads = int(cfg.num_hidden_layers), int(cfg.num_key_value_heads)
        self.heads, self.head_dim = int(cfg.num_attention_heads), int(cfg.head_dim)
        slots = n_pages * page_size
        shape = (slots, self.kv_heads, self.head_dim)
        self.k = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.n_layers)
        ]
        self.v = [torch.zeros_like(t) for t in self.k]
        # RoPE table in float32 from a fresh rotary module (its buffers never see a dtype cast).
        rope = Qwen3RotaryEmbedding(cfg)
        cos, sin = rope(torch.empty(0), torch.arange(max_seq_len)[None])
        self.cos = cos[0].to(self.device, self.dtype)
        self.sin = sin[0].to(self.device, self.dtype)
        self._offsets = torch.arange(page_size, device=self.device)

    # -- slots ---------------------------------------------------------------------------------

    def slots(self, seq: Seq, start: int, end: int) -> torch.Tensor:
        """KV slots of positions [start, end) of ``seq``."""
        ps = self.page_size
        first, last = start // ps, (end - 1) // ps
        pages = torch.tensor(seq.pages[first : last + 1], device=self.device)
        flat = (pages[:, None] * ps + self._offsets[None]).reshape(-1)
        return flat[start - first * ps : end - first * ps]

    def _key_table(self, seqs: list[Seq], lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Padded KV slots [B, Lmax] of the first ``lengths[i]`` positions, and the valid mask."""
        ps = self.page_size
        n_pages = max(-(-n // ps) for n in lengths)
        table = torch.zeros((len(seqs), n_pages), dtype=torch.long)
        for i, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
            used = -(-n // ps)
            table[i, :used] = torch.tensor(s.pages[:used])
        table = table.to(self.device)
        flat = (table[:, :, None] * ps + self._offsets[None, None]).reshape(len(seqs), -1)
        lens = torch.tensor(lengths, device=self.device)
        mask = torch.arange(flat.shape[1], device=self.device)[None] < lens[:, None]
        return flat, mask

    # -- one iteration -------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(self, segments: list[Segment]) -> torch.Tensor:
        """K/V of every segment into the pool; logits [n, vocab] of segments that sample."""
        tokens: list[int] = []
        positions: list[torch.Tensor] = []
        slot_list: list[torch.Tensor] = []
        for g in segments:
            tokens.extend(g.seq.tokens[g.start : g.end])
            positions.append(torch.arange(g.start, g.end))
            slot_list.append(self.slots(g.seq, g.start, g.end))
        ids = torch.tensor(tokens, device=self.device)
        pos = torch.cat(positions).to(self.device)
        slots = torch.cat(slot_list)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [T, 1, D]

        ones = [i for i, g in enumerate(segments) if g.end - g.start == 1]
        offsets = [0]
        for g in segments:
            offsets.append(offsets[-1] + g.end - g.start)
        one_rows = torch.tensor([offsets[i] for i in ones], device=self.device)
        one_keys = (
            self._key_table([segments[i].seq for i in ones], [segments[i].end for i in ones])
            if ones
            else None
        )
        chunks = [
            (offsets[i], g, self.slots(g.seq, 0, g.end))
            for i, g in enumerate(segments)
            if g.end - g.start > 1
        ]

        x = self.model.model.embed_tokens(ids)  # [T, hidden]
        for li, layer in enumerate(self.model.model.layers):
            x = x + self._attention(
                li=li,
                layer=layer,
                x=x,
                cos=cos,
                sin=sin,
                slots=slots,
                one_rows=one_rows,
                one_keys=one_keys,
                chunks=chunks,
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        rows = [offsets[i + 1] - 1 for i, g in enumerate(segments) if g.samples]
        h = self.model.model.norm(x[rows])
        return self.model.lm_head(h).float()

    def _attention(
        self,
        li: int,
        layer: Any,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        one_rows: torch.Tensor,
        one_keys: tuple[torch.Tensor, torch.Tensor] | None,
        chunks: list[tuple[int, Segment, torch.Tensor]],
    ) -> torch.Tensor:
        attn = layer.self_attn
        t = x.shape[0]
        h = layer.input_layernorm(x)
        q = attn.q_norm(attn.q_proj(h).view(t, self.heads, self.head_dim))
        k = attn.k_norm(attn.k_proj(h).view(t, self.kv_heads, self.head_dim))
        v = attn.v_proj(h).view(t, self.kv_heads, self.head_dim)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        kc, vc = self.k[li], self.v[li]
        kc.index_copy_(0, slots, k)
        vc.index_copy_(0, slots, v)
        out = torch.empty_like(q)
        if one_keys is not None:
            key_slots, valid = one_keys
            qd = q[one_rows][:, :, None]  # [B, H, 1, D]
            kd = _gather(kc, key_slots).transpose(1, 2)  # [B, KVH, L, D]
            vd = _gather(vc, key_slots).transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qd, kd, vd, attn_mask=valid[:, None, None], enable_gqa=True
            )
            out[one_rows] = o[:, :, 0]
        for row, g, key_slots in chunks:
            n = g.end - g.start
            qp = q[row : row + n].transpose(0, 1)[None]  # [1, H, n, D]
            kp = _gather(kc, key_slots).transpose(0, 1)[None]  # [1, KVH, end, D]
            vp = _gather(vc, key_slots).transpose(0, 1)[None]
            qpos = torch.arange(g.start, g.end, device=self.device)[:, None]
            causal = torch.arange(g.end, device=self.device)[None] <= qpos  # [n, end]
            o = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=causal, enable_gqa=True)
            out[row : row + n] = o[0].transpose(0, 1)
        return attn.o_proj(out.view(t, self.heads * self.head_dim))

    # -- moving K/V between engines -----------------------------------------------------------

    def export(self, seq: Seq, n: int) -> list[torch.Tensor]:
        """K and V of the first ``n`` positions, per layer, as contiguous CPU tensors."""
        s = self.slots(seq, 0, n)
        out = []
        for li in range(self.n_layers):
            out.append(_gather(self.k[li], s).cpu())
            out.append(_gather(self.v[li], s).cpu())
        return out

    def copy(self, source: Seq, target: Seq, n: int) -> None:
        """K/V of ``source``'s first ``n`` positions into ``target``'s pages (a sample of a
        group takes its leader's prefill)."""
        src, dst = self.slots(source, 0, n), self.slots(target, 0, n)
        for li in range(self.n_layers):
            self.k[li].index_copy_(0, dst, self.k[li].index_select(0, src))
            self.v[li].index_copy_(0, dst, self.v[li].index_select(0, src))

    def write(self, seq: Seq, tensors: list[torch.Tensor]) -> None:
        """Store received K/V (``export``'s layout) into ``seq.pages``."""
        n = tensors[0].shape[0]
        s = self.slots(seq, 0, n)
        for li in range(self.n_layers):
            self.k[li].index_copy_(0, s, tensors[2 * li].to(self.device, self.dtype))
            self.v[li].index_copy_(0, s, tensors[2 * li + 1].to(self.device, self.dtype))


def _gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Rows ``slots`` (any shape) of a [slots, KVH, D] pool; index_select is several times faster
    than advanced indexing here."""
    return pool.index_select(0, slots.reshape(-1)).view(*slots.shape, *pool.shape[1:])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


__all__ = ["PagedRunner"]
