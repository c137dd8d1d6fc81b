"""Iteration-level continuous batching over a paged KV pool (the policy, no threads, no model).

Every iteration: admit queued sequences FCFS while their prompt's pages fit (claiming a resident
trajectory prefix first), give every decoding sequence one token, then fill the rest of the token
budget with prefill chunks (Sarathi-style chunked prefill piggybacked on decode). A decoding
sequence that needs a page when the pool is full first evicts resident prefixes (LRU), then
preempts the youngest running sequence, which is requeued and recomputed later (nothing is lost).

Samples of one request (n > 1, one ``group``) share their prompt's prefill: the first admitted
is the group's leader and prefills; the others wait (no compute) until the leader's K/V covers
their common prefix, copy it (``copy_kv``) and compute only their last prompt token. A leader
that leaves before that hands the role to the next sample, which prefills.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from pearl.engines.base import EngineError
from pearl.engines.blocks import KVBlocks, common_prefix, pages_for
from pearl.engines.sequence import Phase, Sample, Segment, Seq

CopyKV = Callable[[Seq, Seq, int], None]


class Scheduler:
    def __init__(
        self, blocks: KVBlocks, token_budget: int, max_running: int, copy_kv: CopyKV | None = None
    ) -> None:
        self.blocks = blocks
        self.copy_kv = copy_kv  # None: samples of a group prefill each on their own
        self.groups: dict[str, Seq] = {}  # group -> its leader (the sample that prefills)
        self.token_budget = token_budget
        self.max_running = max_running
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # admission order: oldest first
        self.out_of_memory: list[Seq] = []  # alone in the pool and still cannot grow
        self.preemptions = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def enqueue(self, seq: Seq) -> None:
        seq.phase = Phase.QUEUED
        self.waiting.append(seq)

    def drop(self, seq: Seq, keep_prefix: bool) -> None:
        """Take ``seq`` out of the queues; its pages go back, or stay as its trajectory's prefix."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.req.group and self.groups.get(seq.req.group) is seq:
            del self.groups[seq.req.group]
        seq.leader = None
        if seq.pages:
            if keep_prefix and seq.req.trajectory and seq.computed > 0:
                self.blocks.keep_prefix(seq.req.trajectory, seq.tokens[: seq.computed], seq.pages)
            else:
                self.blocks.release(seq.pages)
            seq.pages = []

    def admit(self, import_kv: Callable[[Seq], None]) -> list[tuple[Seq, BaseException]]:
        """Move queued sequences to running while pages last; returns those that cannot run."""
        failed: list[tuple[Seq, BaseException]] = []
        ps = self.blocks.page_size
        while self.waiting and len(self.running) < self.max_running:
            seq = self.waiting[0]
            if pages_for(len(seq.tokens) + 1, ps) > self.blocks.n_pages:
                self.waiting.popleft()
                failed.append(
                    (
                        seq,
                        EngineError(
                            f"request {seq.rid}: {len(seq.tokens)} tokens do not fit the KV "
                            f"pool of {self.blocks.n_pages * ps} tokens; raise kv_budget_bytes"
                        ),
                    )
                )
                continue
            if seq.kv is not None:  # decode role: the K/V arrived from a prefill worker
                need = pages_for(len(seq.tokens) - 1, ps)
                pages = self.blocks.allocate(need)
                if pages is None:
                    break
                self.waiting.popleft()
                seq.pages = pages
                try:
                    import_kv(seq)
                except Exception as e:  # a malformed transfer fails this request only
                    self.blocks.release(seq.pages)
                    seq.pages = []
                    failed.append((seq, e))
                    continue
                seq.kv, seq.phase = None, Phase.DECODE
                self.running.append(seq)
                continue
            reuse, reused = self.blocks.take_prefix(seq.req.trajectory, seq.tokens)
            pages = self.blocks.allocate(pages_for(len(seq.tokens), ps) - len(reused))
            if pages is None:
                if reused:  # give the prefix back; try again when memory frees up
                    self.blocks.keep_prefix(seq.req.trajectory, seq.tokens[:reuse], reused)
                break
            self.waiting.popleft()
            seq.pages, seq.computed, seq.phase = reused + pages, reuse, Phase.PREFILL
            if seq.cached_tokens < 0:
                seq.cached_tokens = reuse
            self.running.append(seq)
            if seq.req.group and self.copy_kv is not None:
                self._join(seq)
        return failed

    def plan(self) -> list[Segment]:
        """This iteration's work: one token per decoding sequence, then prefill chunks."""
        segments: list[Segment] = []
        for seq in [s for s in self.running if s.phase is Phase.DECODE]:
            if seq in self.running and self._grow(seq, seq.computed + 1):
                segments.append(Segment(seq, seq.computed, seq.computed + 1))
        budget = max(self.token_budget - len(segments), self.blocks.page_size)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.phase is Phase.PREFILL:
                if seq.leader is not None and self._follow(seq):
                    continue  # waits for its leader's prefill
                n = min(seq.pending, budget)
                segments.append(Segment(seq, seq.computed, seq.computed + n))
                budget -= n
        return segments

    def _join(self, seq: Seq) -> None:
        """A sample of a group just admitted: it follows the group's leader when it shares
        more of the prompt with it than it already holds, else it leads."""
        leader = self.groups.get(seq.req.group)
        if leader is None or leader is seq:
            self.groups[seq.req.group] = seq
            return
        share = min(common_prefix(leader.tokens, seq.tokens), len(seq.tokens) - 1)
        if share > seq.computed:
            seq.leader, seq.share = leader, share

    def _follow(self, seq: Seq) -> bool:
        """True while ``seq`` waits for its leader; else the leader's K/V of the shared prefix
        is copied (or, the leader gone, ``seq`` prefills: it leads) and it goes on."""
        lead = seq.leader
        while lead is not None:
            if lead.pages and lead.computed >= seq.share:
                assert self.copy_kv is not None
                self.copy_kv(lead, seq, seq.share)
                seq.computed = max(seq.computed, seq.share)
                seq.cached_tokens = max(seq.cached_tokens, seq.share)
                break
            if lead in self.running or lead in self.waiting:
                return True
            successor = self.groups.get(seq.req.group)  # the leader left before its prefill
            if successor is None or successor is lead or successor is seq:
                self.groups[seq.req.group] = seq
                break
            seq.leader = lead = successor
        seq.leader = None
        return False

    def commit(self, segments: list[Segment], samples: list[Sample]) -> list[Seq]:
        """Record a finished iteration; returns the sequences that sampled a token, in order."""
        it = iter(samples)
        sampled = []
        for seg in segments:
            seg.seq.computed = seg.end
            if seg.samples:
                tok, lp, top = next(it)
                seg.seq.push(tok, lp, top)
                seg.seq.phase = Phase.DECODE
                sampled.append(seg.seq)
        return sampled

    def _grow(self, seq: Seq, tokens: int) -> bool:
        """Pages for ``tokens`` tokens of ``seq``, preempting the youngest if need be."""
        need = pages_for(tokens, self.blocks.page_size) - len(seq.pages)
        while need > 0:
            pages = self.blocks.allocate(need)
            if pages is not None:
                seq.pages.extend(pages)
                return True
            if len(self.running) == 1:
                self.running.remove(seq)
                self.out_of_memory.append(seq)
                return False
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Seq) -> None:
        """Recompute later: free the K/V, requeue at the front with prompt + output so far."""
        self.running.remove(seq)
        self.blocks.release(seq.pages)
        seq.pages, seq.computed, seq.phase = [], 0, Phase.QUEUED
        self.waiting.appendleft(seq)
        self.preemptions += 1


__all__ = ["Scheduler"]
