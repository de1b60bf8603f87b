"""The request table: the device state a decode iteration reads and advances, eager or captured.

Each running request holds one row from admission to its end (finish, abort or preemption).
Everything a decode step needs about a request lives in device tensors indexed by row, so a
step reads it with one gather and writes it back with one scatter, and consecutive steps need
nothing from the host but new block-table entries:
- ``lengths`` [table_rows]: L, the request's KV rows; its last token sits at position L, not in the
  KV yet (it is the first token the next step forwards),
- ``last_tokens`` [table_rows]: that token,
- ``seeds`` [table_rows]: its random stream (layers/sampler.py ``random_keys``),
- its sampling parameters (temperature, top-k, top-p, min-p) and whether it is seeded (``seeded``: it samples
  by the Gumbel-max rule with noise of its seed and position alone, layers/sampler.py), one row per row,
- its penalties (repetition, frequency, presence) and, allocated on first use, the vocabulary-wide
  rows that penalties and ``logit_bias`` read: ``logit_bias`` [table_rows, V] (-inf at the tokens outside
  ``allowed_token_ids``), ``prompt_mask`` [table_rows, V]
  and ``output_counts`` [table_rows, V] (the output tokens before position L; a step counts node 0 and the
  drafts on each node's path itself, then adds what it committed: layers/logits_processing.py), and for
  ``min_tokens`` ``stop_mask`` [table_rows, V] (its stop ids: ``stop_token_ids`` and ``eos_token_ids``) with
  ``min_end`` [table_rows] (its prompt's length plus min_tokens: the stop ids are banned at positions before
  it),
- its block table, a row of ``tables`` [table_rows, max_blocks], mirrored in (pinned) host memory and
  copied incrementally: a request's table only grows while it lives.
The last row, ``padding_index``, belongs to no request: padded rows of a captured batch use it;
its length stays 0 and its table points at the pool's padding block, so the KV it writes lands
where no request reads.
"""

from __future__ import annotations

from typing import Sequence

import torch

from outpace.cache.block_pool import BlockPool
from outpace.host_copies import to_device
from outpace.layers.logits_processing import REPETITION_PENALTY_MAX, Penalties
from outpace.layers.sampler import SamplingTensors
from outpace.request import Request


class RequestTable:
    def __init__(
        self,
        pool: BlockPool,
        max_seqs: int,
        max_blocks: int,
        device: torch.device | str,
        vocab_size: int,
        eos_token_ids: Sequence[int] = (),
    ) -> None:
        """``eos_token_ids``: the model's end-of-sequence ids, which ``min_tokens`` bans with a request's
        ``stop_token_ids``."""
        self.pool, self.device, self.vocab_size = pool, torch.device(device), vocab_size
        self.eos_token_ids = tuple(t for t in eos_token_ids if t < vocab_size)
        self.padding_index = max_seqs
        n = max_seqs + 1
        on_gpu = self.device.type == "cuda"
        self.lengths = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.last_tokens = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.seeds = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.temperature = torch.zeros(
            n, dtype=torch.float32, device=self.device
        )  # 0: greedy (the padding row too)
        self.top_k = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.top_p = torch.ones(n, dtype=torch.float32, device=self.device)
        self.min_p = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.seeded = torch.zeros(n, dtype=torch.bool, device=self.device)
        # an all-greedy step's ``greedy`` rows, expanded (``sampling``)
        self._true = torch.ones(1, dtype=torch.bool, device=self.device)
        self.repetition_penalty = torch.ones(n, dtype=torch.float32, device=self.device)
        self.frequency_penalty = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.presence_penalty = torch.zeros(n, dtype=torch.float32, device=self.device)
        self.logit_bias: torch.Tensor | None = (
            None  # [table_rows, V] float32, allocated on first use
        )
        self.prompt_mask: torch.Tensor | None = None  # [table_rows, V] bool
        self.output_counts: torch.Tensor | None = None  # [table_rows, V] int32
        self.stop_mask: torch.Tensor | None = None  # [table_rows, V] bool
        self.min_end = torch.zeros(n, dtype=torch.int64, device=self.device)
        self._biased: set[int] = set()  # indices whose logit_bias row is not zero
        self._unloaded: set[int] = (
            set()
        )  # penalized indices whose prompt and counts rows await load_history
        self.host_tables = torch.full(
            (n, max_blocks), pool.padding_block, dtype=torch.int64, pin_memory=on_gpu
        )
        # [table_rows, max_blocks]: its own copy on the CPU too, so that the CPU runs the updates a GPU does
        self.tables = self.host_tables.to(self.device, copy=True)
        self._written = [0] * n  # table entries copied per row
        self._free = list(range(max_seqs - 1, -1, -1))
        self._index_of: dict[str, int] = {}

    @property
    def max_rows(self) -> int:
        """The KV rows a row's table can address."""
        return self.tables.shape[1] * self.pool.block_size

    @property
    def held_by(self) -> set[str]:
        """The requests that hold a row now."""
        return set(self._index_of)

    @property
    def num_free(self) -> int:
        """Rows no request holds (the padding row not counted)."""
        return len(self._free)

    def idle_rows(self, n: int) -> list[int]:
        """``n`` rows for a step that serves no request (``ModelRunner.probe_replays``): rows no request holds,
        then the padding row where they run out."""
        idle = self._free[::-1][:n]
        return idle + [self.padding_index] * (n - len(idle))

    def rows(
        self, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(tables [b, max_blocks], lengths [b], last_tokens [b], seeds [b]) of the rows ``indices`` [b] on the
        device: one gather (on CUDA one launch, engine/request_rows_kernel.py)."""
        if indices.is_cuda:
            from outpace.engine.request_rows_kernel import gather_rows

            return gather_rows(indices, self.lengths, self.last_tokens, self.seeds, self.tables)
        return (
            self.tables.index_select(0, indices),
            self.lengths[indices],
            self.last_tokens[indices],
            self.seeds[indices],
        )

    def commit(
        self,
        indices: torch.Tensor,
        lengths: torch.Tensor,
        tokens: torch.Tensor,
        num_correct: torch.Tensor,
        bonus: torch.Tensor,
    ) -> torch.Tensor:
        """A decode step's end for the rows ``indices`` [b] (the padding row for padded ones), whose lengths were
        ``lengths`` [b]: each request's length grows by its ``num_correct`` [b] accepted drafts and the bonus, its
        last token becomes ``bonus`` [b], the padding row's length stays 0 (its last token is left unspecified).
        Returns the step's packed outputs [b * width + b]: ``tokens`` [b, width] (the output tokens) row by row,
        then ``num_correct``. On CUDA one launch (engine/commit_kernel.py)."""
        if indices.is_cuda:
            from outpace.engine.commit_kernel import commit_rows

            return commit_rows(
                indices,
                lengths,
                tokens,
                num_correct,
                bonus,
                self.lengths,
                self.last_tokens,
                self.padding_index,
            )
        self.lengths[indices] = lengths + num_correct + 1
        self.last_tokens[indices] = bonus
        self.lengths[self.padding_index :].zero_()  # (a slice: no host scalar copied in a capture)
        return torch.cat([tokens.reshape(-1), num_correct])

    def index_of(self, request_id: str) -> int:
        return self._index_of[request_id]

    def holds(self, request_id: str, row: int) -> bool:
        """Whether the request holds this row now."""
        return self._index_of.get(request_id) == row

    def assign(self, reqs: Sequence[Request]) -> list[int]:
        """Give each request a row (unless it holds one) with its seed and sampling parameters; returns their
        indices."""
        new = [r for r in reqs if r.request_id not in self._index_of]
        if new:
            indices = [self._free.pop() for _ in new]
            self._index_of.update(zip((r.request_id for r in new), indices))
            self._load_params(new, indices)
        return [self._index_of[r.request_id] for r in reqs]

    def _load_params(self, reqs: list[Request], indices: list[int]) -> None:
        """Write the requests' seeds and sampling parameters into their new indices, with one write per buffer."""
        params = [r.params for r in reqs]
        index = to_device(indices, self.device)
        rows = SamplingTensors.from_params(params, "cpu")
        for buffer, values in (
            (self.temperature, rows.temperature),
            (self.top_k, rows.top_k),
            (self.top_p, rows.top_p),
            (self.min_p, rows.min_p),
            (self.seeded, rows.seeded),
            (self.seeds, [r.seed for r in reqs]),
            (
                self.repetition_penalty,
                [min(p.repetition_penalty, REPETITION_PENALTY_MAX) for p in params],
            ),
            (self.frequency_penalty, [p.frequency_penalty for p in params]),
            (self.presence_penalty, [p.presence_penalty for p in params]),
            (self.min_end, [r.num_prompt_tokens + r.params.min_tokens for r in reqs]),
        ):
            buffer[index] = to_device(values, self.device, buffer.dtype)
        for s, p in zip(indices, params):
            if p.penalized:
                self._allocate_penalty_rows()
                self._unloaded.add(s)
            if s in self._biased:
                self.logit_bias[s].zero_()
                self._biased.discard(s)
            if p.allowed_token_ids is not None:  # every other token -inf, biased or not
                self.logit_bias[s] = float("-inf")
                self.logit_bias[s, to_device(list(p.allowed_token_ids), self.device)] = 0.0
                self._biased.add(s)
            if p.logit_bias:
                ids = to_device(list(p.logit_bias), self.device)
                self.logit_bias[s, ids] += to_device(
                    list(p.logit_bias.values()), self.device, torch.float32
                )
                self._biased.add(s)
            if p.min_tokens:
                stops = to_device([*self.eos_token_ids, *p.stop_token_ids], self.device)
                self.stop_mask[s] = False
                self.stop_mask[s, stops] = True

    def _allocate_penalty_rows(self) -> None:
        if self.logit_bias is None:
            n, v = self.lengths.shape[0], self.vocab_size
            self.logit_bias = torch.zeros(n, v, dtype=torch.float32, device=self.device)
            self.prompt_mask = torch.zeros(n, v, dtype=torch.bool, device=self.device)
            self.output_counts = torch.zeros(n, v, dtype=torch.int32, device=self.device)
            self.stop_mask = torch.zeros(n, v, dtype=torch.bool, device=self.device)

    def load_history(self, req: Request, length: int) -> None:
        """Before a penalized request's first sampling in this row: its prompt's tokens and the counts of its
        output tokens before position ``length`` (the position of the token sampled next, or of a decode
        step's last token, which the step counts as node 0)."""
        s = self._index_of[req.request_id]
        if s not in self._unloaded:
            return
        self._unloaded.discard(s)
        prompt = torch.tensor(req.prompt_token_ids, dtype=torch.int64)
        self.prompt_mask[s] = to_device(
            torch.zeros(self.vocab_size, dtype=torch.bool).index_fill_(0, prompt, True),
            self.device,
            torch.bool,
        )
        before = torch.tensor(req.token_ids[req.num_prompt_tokens : length], dtype=torch.int64)
        self.output_counts[s] = to_device(
            torch.bincount(before, minlength=self.vocab_size), self.device, torch.int32
        )

    def penalties(self, indices: torch.Tensor) -> Penalties:
        """The rows' penalties and logit biases (``indices`` [n] on the device); the rows must be allocated."""
        return Penalties(
            self.repetition_penalty[indices],
            self.frequency_penalty[indices],
            self.presence_penalty[indices],
            self.logit_bias[indices],
            self.prompt_mask[indices],
            self.output_counts[indices],
            self.min_end[indices],
            self.stop_mask[indices],
        )

    def release(self, request_id: str) -> None:
        """The request ended or was preempted: its row is free again (its table row reset on reuse)."""
        s = self.retire(request_id)
        if s is not None:
            self.free_row(s)

    def retire(self, request_id: str) -> int | None:
        """The request ended or was preempted while a step in flight may still read its row: it no longer holds
        the row, which no request is given until ``free_row`` (``ModelRunner.release``). Returns the row (None:
        it held none)."""
        return self._index_of.pop(request_id, None)

    def free_row(self, s: int) -> None:
        """A retired row, no longer read by any step in flight: free for the next request."""
        self._unloaded.discard(s)
        self._free.append(s)
        self._reset_table(s)

    def start_decoding(
        self, indices: list[int], lengths: list[int], last_tokens: torch.Tensor
    ) -> None:
        """Prefills completed: row indices[i] has lengths[i] KV rows and its last token (just sampled,
        not in the KV) is last_tokens[i] ([n] on the device)."""
        index = to_device(indices, self.device)
        self.lengths[index] = to_device(lengths, self.device)
        self.last_tokens[index] = last_tokens

    def sync_tables(self, request_ids: Sequence[str]) -> None:
        """Copy to the device the table entries these requests gained since the last copy."""
        width, written, table_of = self.host_tables.shape[1], self._written, self.pool.table
        at, blocks = [], []  # the new entries' flat indices in host_tables, and their blocks
        for rid in request_ids:
            s, table = self._index_of[rid], table_of(rid)
            n, w = len(table), written[s]
            if n == w:  # (most requests, most steps)
                continue
            if n > width:
                raise ValueError(f"request {rid!r} has {n} blocks, its row holds {width}")
            if n < w:  # shrank (preempted and re-admitted under the same row)
                self._reset_table(s)
                w = 0
            at += range(s * width + w, s * width + n)
            blocks += table[w:]
            written[s] = n
        if blocks:
            places = torch.tensor([at, blocks])  # [2, new entries]: flat index, block
            self.host_tables.view(-1)[places[0]] = places[1]
            # only the new entries, in one queued copy (the whole table was 4 MB for 64 rows of a 128k context,
            # each step that added blocks); a replay queued before reads its rows' earlier entries, which no
            # update changes
            flat, values = to_device(places, self.device)
            self.tables.view(-1)[flat] = values

    def _reset_table(self, s: int) -> None:
        self.host_tables[s].fill_(self.pool.padding_block)
        self._written[s] = 0
        self.tables[s].copy_(self.host_tables[s], non_blocking=True)

    def sampling(
        self, indices: torch.Tensor, greedy: bool, filtered: bool, seeded: bool
    ) -> SamplingTensors:
        """The rows' sampling parameters (``indices`` [n] on the device); host flags: ``greedy``, every row is
        (argmax only); ``filtered``, some row applies top-k, top-p or min-p; ``seeded``, some row is seeded
        (padding rows are greedy)."""
        if greedy:  # nothing reads the parameters: the padding row's (greedy) rows, no launches
            pad = self.padding_index
            n = indices.shape[0]
            return SamplingTensors(
                self.temperature[pad:].expand(n),
                self.top_k[pad:].expand(n),
                self.top_p[pad:].expand(n),
                self.min_p[pad:].expand(n),
                greedy=self._true.expand(n),
                seeded=self.seeded[pad:].expand(n),  # (the padding row's: False)
                all_greedy=True,
                any_seeded=False,
                need_top_k=False,
                need_top_p=False,
                need_min_p=False,
            )
        return SamplingTensors(
            self.temperature[indices],
            self.top_k[indices],
            self.top_p[indices],
            self.min_p[indices],
            seeded=self.seeded[indices],
            all_greedy=greedy,
            need_top_k=filtered,
            need_top_p=filtered,
            need_min_p=filtered,
            any_seeded=seeded,
        )
