"""MTP proposer: the target checkpoint's own multi-token-prediction layers draft (chains only).

Row convention: MTP layer k at row t reads the embedding of token t + k + 1 and a hidden state for
row t, and predicts token t + k + 2 (rotary position t). The hidden state is, chained
(Step-3.5-Flash; always for DeepSeek-V3-style layers), layer k - 1's pre-norm output at row t (layer
0: the target's state at t); not chained, the target's state at every layer. The target's state is
its last hidden state in the form the layers read (models/drafts/mtp.py ``target_state``: pre-norm, or
post-norm for DeepSeek-V3-style layers), as are their embedding and head. Layer k's KV row t is
final once token t + k + 1 is committed.

Let L be a request's length (its last token, committed, sits at position L) and S the layers used
(at most ``num_steps``), K = S - 1. Every ``draft`` runs each of the S layers once, in chain order,
over the row's pending rows L - count .. L - 1: the rows committed since the last draft (forward)
plus the K rows before them (fewer near position 0), whose KV some layer wrote from a draft token
last time (layer k re-runs k of them; the others rewrite identical KV). Layer k's row t reads token t + k + 1:
a committed one (each pending row keeps the token after it) or, for its last k rows, drafts 1 .. k;
its last row predicts draft k + 1. With more steps than layers the last layer goes on
autoregressively (a single layer reused, DeepSeek-V3 style, or the last of a chain): step j > S is one
row at position L + j - S - 1 reading draft j - 1 and the previous step's output, as the layer's own rows
read the layer before's. (vLLM cycles through a chain's layers instead; here a layer attends only to rows
it wrote itself, and in a chain the last layer is one trained to read an MTP layer's output.) A draft of
fewer steps than S still runs all S layers (the rows past the drafts read padding tokens and are re-run
next time), so every layer's KV is final up to row L - K - 1 whatever the step drafted.

State per row (speculative/proposer.py ``PendingRows``), padded to ``width`` = K + num_steps + 1 rows
(at most K kept plus a verify's committed rows), adaptive drafting ``HOLD_ROWS`` more: each pending
row's target state and the token after it, the first pending row and the count (>= 1 once decoding).
The window's padding rows past L - 1 write KV that nothing reads (causal attention; the next draft
rewrites rows from its first pending row on). ``update`` keeps the last min(count, K) pending rows and
appends the verify's committed rows; a held zero-draft step (``hold``: no forward) appends its one
committed row to all the pending rows, so the next draft runs every layer over them as the skipped
drafts would have (each layer's row t once token t + k + 1 is committed: the KV it would have ended
with); ``absorb`` extends every layer over a prompt's chunk and leaves its last max(K, 1) rows pending
(the last row predicts draft 1, whether decoding follows a completed prompt or a recomputed one that
stops a token short). Layer k's row t reads token t + k + 1: where the request holds every token its
layers read past the chunk (a chunk followed by more than K of its tokens; a single layer, K = 0,
always, the chunk's last next token being the prompt's next or the one sampled or recomputed), the
chunk runs whole: its pending rows too, whose KV is then final (the next draft rewrites it as it was),
so the next chunk re-runs nothing. Otherwise (a chunk followed by at most K tokens: the final one, or
one just before it) the pending rows are left unrun, and the next chunk, if any, takes them with it
and runs eagerly (``absorbs_captured``; prefill chunks precede decoding: none finds held rows).
"""

from __future__ import annotations

from pathlib import Path

import torch

from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.checkpoint import weight_files_named
from outpace.config import SpeculativeConfig
from outpace.host_copies import to_device
from outpace.layers.moe import RoutedExperts
from outpace.layers.routed_rows import routed_rows
from outpace.speculative.chain import chain_drafts, draft_token
from outpace.speculative.hot_vocab import readouts
from outpace.speculative.proposer import (
    HOLD_ROWS,
    DecodeRows,
    Drafts,
    DraftShape,
    PendingRows,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.validation import ConfigError


class MTPProposer(Proposer):
    takes_draft_checkpoint = False  # the target's own MTP layers draft
    takes_token_map = True  # their heads are over the target's vocabulary

    def __init__(
        self,
        spec: SpeculativeConfig,
        target,
        pool: BlockPool,
        max_requests: int,
        dtype: torch.dtype,
        device: str,
        attention_backend: str = "torch",
    ) -> None:
        cfg = target.config
        n = cfg.num_nextn_predict_layers
        if n == 0:
            raise ConfigError(f"--method mtp needs a target with MTP layers: {_why_none(target)}")
        if spec.topk != 1:
            raise ConfigError(
                f"SpeculativeConfig.topk={spec.topk} is invalid for mtp: must be 1 (a chain)"
            )
        super().__init__(spec, pool, max_requests, device, attention_backend)
        self.target = target
        self.layers = list(target.mtp_layers)[: min(n, spec.num_steps)]
        self.chained = cfg.chain_mtp_hidden_states or self.layers[0].chained_by_layout
        # per layer: whether it routes rows to experts, so that rows whose output nothing reads can skip them
        self.mixtures = [
            any(isinstance(m, RoutedExperts) for m in l.modules()) for l in self.layers
        ]
        bind_kv_cache(target.mtp_layers, pool, dtype, device)
        self.kv_reads_ahead = len(self.layers)  # layer k's row t reads token t + k + 1
        self.keep = len(self.layers) - 1  # K: rows before the new ones that each draft re-runs
        held = HOLD_ROWS if spec.adaptive else 0  # only adaptive drafting has zero-draft steps
        verify_rows = self.keep + spec.num_steps + 1  # the most a verify leaves pending
        self.pending = PendingRows(
            max_requests + 1, verify_rows + held, cfg.hidden_size, dtype, self.device, verify_rows
        )  # target states
        self.hold_window = self.pending.width if held else 0
        self.narrow_window = verify_rows if held else 0
        # each layer's drafts: its head, or with a token map the head's rows of its tokens (speculative/hot_vocab.py)
        self.readouts = readouts(
            [layer.head_parts(target) for layer in self.layers], spec.token_map, cfg.vocab_size
        )

    @property
    def lookahead(self) -> int:
        # the verify's rows reach L + num_steps; the window's padding rows start + width - 1 <= L + width - 2
        return max(self.spec.num_steps, self.pending.width - 2)

    @property
    def unsettled_rows(self) -> int:
        return self.pending.width  # the pending window, re-run by the next draft

    def state(self) -> list[torch.Tensor]:
        return self.pending.tensors()

    def pending_rows(self, shape: DraftShape) -> int:
        # the kept rows and the verify's (a prefill leaves at most K + 1)
        return self.keep + shape.num_steps + 1

    def _target_state(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layers[0].target_state(self.target, hidden)

    # ---- committed rows ------------------------------------------------------------------------
    # A prefill's rows reach the layers' KV caches in two parts: ``_settle`` keeps each chunk's last rows pending
    # (the window the next draft re-runs) and says which rows the layers run over; the layers' forward runs
    # eagerly (``absorb``) or as captured (``absorb_layers``, then ``absorb_state``: engine/prefill_graphs.py).
    captures_absorb = True

    @property
    def absorb_reach(self) -> int:
        return len(self.layers) - 1  # layer k's row t reads the token after row t + k

    def absorb(self, prefill: PrefillRows) -> None:
        run = self._settle(prefill)
        if run is None:
            return
        take, firsts, runs, seqs = run
        meta = build_paged_metadata(
            [prefill.tables[i] for i in take],
            [firsts[i] for i in take],
            [runs[i] for i in take],
            self.pool.block_size,
            self.device,
        )
        pos = torch.cat([torch.arange(firsts[i], firsts[i] + runs[i]) for i in take]).to(
            self.device
        )  # [m]
        target_hidden = torch.cat([seqs[i][0][: runs[i]] for i in take])  # [m, hidden]
        self._run_layers(
            meta,
            pos,
            lambda k: torch.cat([seqs[i][1][k : k + runs[i]] for i in take]),  # [m]
            target_hidden,
        )

    def absorb_buffer(self, rows: int) -> torch.Tensor:
        return self.pending.hidden.new_zeros(rows, self.pending.hidden.shape[-1])

    def absorb_rows(self, prefill: PrefillRows) -> torch.Tensor:
        return prefill.hidden_states[prefill.rows]  # [total, hidden]

    def absorb_layers(self, meta, token_ids, next_ids, rows) -> None:
        size = next_ids.shape[1] - self.absorb_reach  # P: a chunk's rows
        self._run_layers(
            meta,
            meta.token_positions,
            lambda k: next_ids[:, k : k + size].flatten(),  # [K * P]
            self._target_state(rows),
        )

    def absorb_state(self, prefill: PrefillRows) -> None:
        self._settle(prefill)

    def absorbs_captured(self, prefill: PrefillRows) -> bool:
        return not any(self._takes_pending(prefill))

    def _takes_pending(self, prefill: PrefillRows) -> list[bool]:
        """Per chunk: whether it follows a chunk of its request that left rows unrun (module docstring): one
        followed by at most K tokens that the request holds."""
        k = self.absorb_reach
        return [
            start > len(reused) and start + k > n - 1
            for start, reused, n in zip(
                prefill.starts, prefill.reused_token_ids, prefill.num_tokens
            )
        ]

    def _settle(self, prefill: PrefillRows):
        """``absorb`` but the layers' forward: each chunk's last rows (after those a previous chunk left unrun)
        become its pending window. Returns None when no layer runs, else (the chunks with rows to run, each
        chunk's first row, its rows to run, its (target states [rows, hidden], next tokens [rows + K]))."""
        hidden = self._target_state(prefill.hidden_states[prefill.rows])  # [total, hidden]
        offsets = [0] + torch.tensor(prefill.counts).cumsum(0).tolist()
        pending, reach = self.pending, self.absorb_reach
        takes = self._takes_pending(prefill)
        counts = (
            pending.count[torch.tensor(prefill.req_indices, device=self.device)].tolist()
            if any(takes)
            else [0] * len(takes)
        )  # (a read of the device: only after a chunk that left rows unrun)
        # per chunk: its rows (pending ones first), the first, those run
        seqs, firsts, runs = [], [], []
        # per chunk: its pending window's first position and rows, written once after the loop (one copy: an
        # element written from the host, ``pending.start[s] = ...``, is a copy that waits on the GPU)
        window_starts, window_counts = [], []
        chunks = zip(prefill.req_indices, prefill.starts, prefill.counts, prefill.num_tokens)
        for i, (s, start, count, n) in enumerate(chunks):
            held = counts[i] if takes[i] else 0
            h = torch.cat([pending.hidden[s, :held], hidden[offsets[i] : offsets[i + 1]]])
            t = torch.cat(
                [
                    pending.tokens[s, :held],
                    prefill.next_token_ids[offsets[i] : offsets[i + 1]],
                    prefill.ahead_token_ids[i],
                ]
            )
            keep = min(max(self.keep, 1), h.shape[0])
            pend = h.shape[0] - keep  # the first row left pending
            # the last token the host knows: past the prompt, the one just sampled
            known = max(n - 1, start + count)
            whole = start + count + reach <= known  # every token the chunk's layers read is known
            seqs.append((h, t))  # [rows, hidden], [rows + K]
            firsts.append(start - held)
            runs.append(h.shape[0] if whole else pend)
            pending.hidden[s, :keep] = h[pend:]
            pending.tokens[s, :keep] = t[pend : pend + keep]
            window_starts.append(start - held + pend)
            window_counts.append(keep)
        rows, starts, keeps = to_device(
            [prefill.req_indices, window_starts, window_counts], self.device
        )
        pending.start[rows] = starts
        pending.count[rows] = keeps
        take = [i for i, m in enumerate(runs) if m > 0]
        return (take, firsts, runs, seqs) if take else None

    def _run_layers(self, meta, pos: torch.Tensor, tokens_at, target_hidden: torch.Tensor) -> None:
        """The layers over rows at ``pos`` [m] (``meta``): layer k reads ``tokens_at(k)`` [m], the token after
        each row's k-th next, and the previous layer's output (chained) or ``target_hidden`` [m, hidden]."""
        h = target_hidden
        nowhere = torch.zeros_like(pos, dtype=torch.bool)  # [m]
        with forward_context(meta, self.backend):
            for k, layer in enumerate(self.layers):  # layer k's row t reads token t + k + 1
                # every row where the next layer reads them; else none (no draft reads a prompt's rows)
                with routed_rows(None if self._next_layer_reads(k) else nowhere):
                    h = layer(pos, tokens_at(k), h if self.chained else target_hidden, self.target)

    def update(self, verified: Verified) -> None:
        # every verify row's state (a chain's rows are at most the rows a window takes), then the window
        state = self._target_state(verified.hidden_states)  # [b * nodes, hidden]
        self.pending.take_verified(verified, state, self.keep, self.spec.num_steps + 1)

    def hold(self, verified: Verified) -> None:
        # a zero-draft step's forward is node 0 alone, its one committed row, followed by the bonus token
        hidden = self._target_state(verified.hidden_states)  # [b, hidden]
        self.pending.append(verified.rows.req_indices, hidden, verified.result.bonus_token_ids)

    # ---- drafting ------------------------------------------------------------------------------
    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        window = self.pending.window(rows.req_indices, rows.narrow_window)
        tokens, probs = [], []  # drafts, each [b]
        h = window.hidden  # [b * w, hidden]
        w = window.tokens.shape[1]
        last_rows = self._last_rows(window) if any(self.mixtures) else None  # [b * w]
        with rows.context(window.start, w, self.backend):
            for k, layer in enumerate(self.layers):
                ids = self.pending.layer_tokens(window, tokens, k)  # [b * w] (docstring: t + k + 1)
                with routed_rows(self._rows_read(k, shape, window.live, last_rows)):
                    h = layer(
                        window.positions, ids, h if self.chained else window.hidden, self.target
                    )
                if k < shape.num_steps:
                    tokens.append(
                        draft_token(
                            rows,
                            k + 1,
                            probs,
                            lambda: self.readouts[k].greedy_tokens(h, window.last),
                            lambda: self.readouts[k].logits(h[window.last]),
                        )
                    )
        if shape.num_steps > len(self.layers):  # (the window's last rows gathered only for these)
            layer, h = self.layers[-1], h[window.last]
        for j in range(len(self.layers) + 1, shape.num_steps + 1):  # the last layer goes on
            row = rows.lengths + j - len(self.layers) - 1  # (docstring: it reads draft j - 1)
            with rows.context(row, 1, self.backend):
                h = layer(row, tokens[-1], h, self.target)
            tokens.append(
                draft_token(
                    rows,
                    j,
                    probs,
                    lambda: self.readouts[-1].greedy_tokens(h),
                    lambda: self.readouts[-1].logits(h),
                )
            )
        return chain_drafts(rows, tokens, probs)

    # ---- rows whose output something reads (layers/routed_rows.py) ------------------------------
    # A mixture's MTP layer routes only those rows to experts: the others still write their KV rows (from the
    # layer's input), their experts are not read, and the rows read come out bit for bit as with every row
    # routed (tests/kernels/test_moe_kernel.py). The window's padding rows are never read.

    def _next_layer_reads(self, k: int) -> bool:
        """Whether layer k + 1 reads layer k's output at every pending row (chained; its KV rows come from it)."""
        return self.chained and k + 1 < len(self.layers)

    def _rows_read(
        self, k: int, shape: DraftShape, live: torch.Tensor, last_rows: torch.Tensor | None
    ) -> torch.Tensor:
        """[b * w] bool: the rows of layer k's output that something reads in a draft. Besides the next
        layer, a draft reads each window's last row (``last_rows``) where layer k drafts, or where the
        single layer goes on past the window; the last layer's other rows feed nothing."""
        if not self.mixtures[k] or self._next_layer_reads(k):
            return live  # (a layer without experts routes nothing: any mask serves)
        drafts = k < shape.num_steps or shape.num_steps > len(self.layers)
        return last_rows if drafts else torch.zeros_like(live)

    @staticmethod
    def _last_rows(window) -> torch.Tensor:
        """[b * w] bool: each window's last pending row."""
        return torch.zeros_like(window.live).index_fill_(0, window.last, True)


def _why_none(target) -> str:
    """Why a target serves without MTP layers: its tensors hold none in the architecture's layout where its
    config counts some, or its config counts none."""
    cfg = target.config
    directory = getattr(target, "checkpoint_dir", None)  # (set by models/loader.py)
    path = Path(directory) / "config.json" if directory is not None else "config.json"
    counted = cfg.raw.get("num_nextn_predict_layers") or 0
    if counted:
        files = f" ({weight_files_named(directory)})" if directory is not None else ""
        return (
            f"{path}: the {cfg.architecture} checkpoint counts num_nextn_predict_layers = "
            f"{counted} but its tensors hold no MTP layer in that architecture's layout{files}"
        )
    return f"{path}: the {cfg.architecture} checkpoint has num_nextn_predict_layers = 0"
