"""Standalone draft model: any model outpace loads, with the target's tokenizer, drafting
autoregressively. Its paged KV lives at the same rows as the target's (shared block tables): each
propose first runs the rows committed since the last one plus the bonus token's row, then one
row per further draft step.

A draft with recurrent layers (a hybrid such as Qwen3-Next: layers/recurrent.py) keeps its own state rows
(cache/recurrent_states.py, indexed by the request row like the target's): row s holds the draft's state after
every token before its first pending row. ``absorb`` carries it across prefill chunks; ``draft`` runs the
pending rows as a verify does (a snapshot after each), keeps the snapshot of the last committed token, lets
the further draft steps advance the row, then puts that snapshot back: the same rollback as the target's,
at the last committed row instead of the last correct draft.
"""

from __future__ import annotations

from pathlib import Path

import torch

from outpace.attention import forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.cache.recurrent_states import RecurrentStates
from outpace.config import SpeculativeConfig
from outpace.host_copies import to_device
from outpace.layers.mla import MultiHeadLatentAttention
from outpace.layers.recurrent import RecurrentMetadata
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.speculative.chain import chain_drafts, choose_chain
from outpace.speculative.proposer import (
    DecodeRows,
    Drafts,
    DraftShape,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.speculative.rows import prefill_extension
from outpace.validation import ConfigError, ConfigFields, is_int64, read_json_object


def shared_vocab_size(target_dir: Path, draft_dir: Path) -> int:
    """The number of token ids a draft may propose: the draft must tokenize exactly as the target.

    When both directories carry a tokenizer.json, their token -> id maps (the model's vocabulary and
    the added tokens) must be equal; the embeddings may then be padded to different sizes (e.g.
    Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, over the same 151665 tokens), and the shared
    size is the tokenizer's: the ids past it are padding rows of the embedding, which no text ever
    produces. Without both tokenizer.json files the vocab sizes must be equal, and that is the size.
    A draft that does not fit is refused naming the file (config.json or tokenizer.json) and the field.
    """
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    t, d = ModelConfig.from_pretrained(target_dir), ModelConfig.from_pretrained(draft_dir)
    files = [target_dir / "tokenizer.json", draft_dir / "tokenizer.json"]
    if not all(f.is_file() for f in files):
        if t.vocab_size != d.vocab_size:
            missing = " and ".join(str(f) for f in files if not f.is_file())
            raise ConfigError(
                f"{draft_dir / 'config.json'}: the draft model does not fit the target: "
                f"vocab_size {d.vocab_size} != target vocab_size {t.vocab_size} "
                f"({target_dir / 'config.json'}), and without {missing} their tokenizers cannot "
                "be compared: a draft model must share the target's tokenizer"
            )
        return t.vocab_size
    (target_ids, _), (draft_ids, draft_added) = (_token_ids(f) for f in files)
    if target_ids != draft_ids:
        raise ConfigError(
            f"{files[1]}: the draft model does not fit the target: its tokenizer differs from the "
            f"target's {files[0]}: {_first_difference(target_ids, draft_ids, draft_added)}"
        )
    size = max(target_ids.values()) + 1
    for directory, cfg in ((draft_dir, d), (target_dir, t)):  # the draft's config first
        if cfg.vocab_size < size:
            fits = "the draft model does not fit the target: " if directory == draft_dir else ""
            raise ConfigError(
                f"{directory / 'config.json'}: {fits}vocab_size {cfg.vocab_size} leaves no "
                f"embedding row for ids {cfg.vocab_size} .. {size - 1} of "
                f"{directory / 'tokenizer.json'}"
            )
    return size


def _first_difference(target: dict[str, int], draft: dict[str, int], draft_added: set[str]) -> str:
    """The first token (by id) that the two token -> id maps disagree on, named by the draft tokenizer.json's field
    that gives it (model.vocab or added_tokens), and how many tokens differ."""
    differ = [tok for tok in target.keys() | draft.keys() if target.get(tok) != draft.get(tok)]
    tok = min(differ, key=lambda t: (draft.get(t, target.get(t)), t))
    field = "added_tokens" if tok in draft_added else "model.vocab"
    if tok not in draft:
        what = (
            f"fields 'model.vocab' and 'added_tokens' lack {tok!r} (the target's id {target[tok]})"
        )
    elif tok not in target:
        what = f"field {field!r} gives {tok!r} id {draft[tok]}, a token the target's lacks"
    else:
        what = f"field {field!r} gives {tok!r} id {draft[tok]}, the target's id {target[tok]}"
    return what + (f" ({len(differ)} tokens differ)" if len(differ) > 1 else "")


def _token_ids(path: Path) -> tuple[dict[str, int], set[str]]:
    """A tokenizer.json's token -> id map: the model's vocabulary (a token -> id object, or for Unigram models a
    list of [token, score] in id order: the tokenizers library's serialization) and the added (special) tokens,
    and the set of the added tokens. A file of another shape is refused naming it and the field."""
    fields = ConfigFields(read_json_object(path), str(path))
    model = fields.mapping("model")
    if model is None:
        raise fields.fail("model", None, "an object (the tokenizer's model and its vocab)")
    vocab = model.get("vocab")
    if isinstance(vocab, dict) and vocab and all(is_int64(i) and i >= 0 for i in vocab.values()):
        ids = dict(vocab)
    elif isinstance(vocab, list) and vocab and all(_is_unigram_entry(e) for e in vocab):
        ids = {entry[0]: i for i, entry in enumerate(vocab)}
    else:
        raise model.fail(
            "vocab",
            f"<{type(vocab).__name__}>",
            "a non-empty token -> id object, or a list of [token, score]",
        )
    added = fields.get("added_tokens") or []
    if not (isinstance(added, list) and all(_is_added_token(t) for t in added)):
        raise fields.fail("added_tokens", f"<{type(added).__name__}>", "a list of {content, id}")
    ids.update({t["content"]: t["id"] for t in added})
    return ids, {t["content"] for t in added}


def _is_unigram_entry(entry) -> bool:
    return isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], str)


def _is_added_token(token) -> bool:
    return (
        isinstance(token, dict)
        and isinstance(token.get("content"), str)
        and is_int64(token.get("id"))
        and token["id"] >= 0
    )


class DraftModelProposer(Proposer):
    """A smaller model of the same tokenizer drafts. Draft row t reads the token at t (position t) and
    predicts the token at t + 1, so its KV row t is final once token t is committed.

    State per row: the committed tokens whose draft rows are not final yet ("pending": the last token
    after a prefill; after a verify that accepted a drafts, the a + 1 tokens at L + 1 .. L + a + 1),
    padded to ``num_steps + 1``. ``draft`` extends over them (padded rows lie past L and are rewritten
    by the draft steps before anything reads them), then step j >= 2 is one row at L + j - 1 reading
    draft j - 1."""

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
        if spec.topk != 1:
            raise ConfigError(
                f"SpeculativeConfig.topk={spec.topk} is invalid for draft: must be 1 (a chain)"
            )
        self.vocab_size = target.config.vocab_size
        self.shared_vocab = shared_vocab_size(target.checkpoint_dir, Path(spec.draft))
        super().__init__(spec, pool, max_requests, device, attention_backend)
        # rotary tables over the target's whole context (models/loader.py covering_positions)
        self.draft_model = load_model(
            spec.draft,
            dtype,
            device,
            progress=False,
            min_positions=target.config.max_position_embeddings,
        )
        bind_kv_cache(self.draft_model.model, pool, dtype, device)
        self.width = spec.num_steps + 1
        # a recurrent draft's state per request row, a snapshot row per pending row (none: no-ops)
        self.states = RecurrentStates(
            self.draft_model.model, max_requests + 1, self.width, dtype, device
        )
        self.pending_tokens = torch.zeros(
            max_requests + 1, self.width, dtype=torch.int64, device=self.device
        )
        self.pending_start = torch.zeros(
            max_requests + 1, dtype=torch.int64, device=self.device
        )  # first pending row
        self.pending_count = torch.ones(max_requests + 1, dtype=torch.int64, device=self.device)

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps

    @property
    def unsettled_rows(self) -> int:
        return (
            self.spec.num_steps
        )  # pending rows (after a verify, all but the first were written by draft steps)

    def prefix_caching_refusal(self) -> str | None:
        if self.states.has_state:
            return (
                f"the draft {self.spec.draft} has recurrent layers, and their state is not cached at block "
                f"boundaries"
            )
        return None

    def state(self) -> list[torch.Tensor]:
        return [self.pending_tokens, self.pending_start, self.pending_count] + self.states.tensors()

    def _forward(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """token_ids [num_rows]: committed or drafted ids. A padding id of the target's embedding (one no
        text produces, but which a target may still emit) is read by the draft as id 0 rather than past
        its own embedding: it can only change what the draft proposes, never what is committed."""
        return self.draft_model(
            token_ids.masked_fill(token_ids >= self.shared_vocab, 0), positions
        ).hidden_states

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] -> [n, target vocab]: the shared ids' logits, -inf elsewhere (padding rows of either
        embedding are never drafted)."""
        draft_logits = self.draft_model.compute_logits(hidden)
        full = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        full[:, : self.shared_vocab] = draft_logits[:, : self.shared_vocab]
        return full

    def _advance(self, indices: torch.Tensor) -> RecurrentMetadata | None:
        """A draft step's recurrent metadata (device tensors, capturable): each row continues its row's state
        and leaves its state there."""
        return (
            RecurrentMetadata(indices, torch.ones_like(indices, dtype=torch.bool))
            if self.states.has_state
            else None
        )

    def absorb(self, prefill: PrefillRows) -> None:
        ext = prefill_extension(prefill, [0] * len(prefill.counts), self.pool.block_size)
        take = [
            i for i, c in enumerate(prefill.counts) if c > 0
        ]  # the requests ext holds, in order
        with ext.context(self.backend) as ctx:
            ctx.recurrent = self.states.prefill(
                [prefill.req_indices[i] for i in take], [prefill.starts[i] for i in take]
            )
            self._forward(prefill.token_ids[ext.rows], ext.positions)
        self.absorb_state(prefill)

    @property
    def captures_absorb(self) -> bool:
        """Its prompt forward runs as captured (engine/prefill_graphs.py) unless padding rows would advance a
        recurrent state or the draft's MLA would take its expanded form, which the prefill buckets stop below
        only for the target's."""
        return not self.states.has_state and not any(
            isinstance(m, MultiHeadLatentAttention) for m in self.draft_model.modules()
        )

    def absorb_layers(self, meta, token_ids, next_ids, rows) -> None:
        with forward_context(meta, self.backend):
            self._forward(token_ids, meta.token_positions)

    def absorb_state(self, prefill: PrefillRows) -> None:
        last_rows = prefill.last_rows
        done = [i for i, f in enumerate(prefill.final) if f]
        if done:  # the sampled token, at L = the prompt's length, is pending
            # [3, len(done)]: each completed prompt's row, its last row in the prefill, its length L
            indices, last, length = to_device(
                [
                    [prefill.req_indices[i] for i in done],
                    [last_rows[i] for i in done],
                    [prefill.starts[i] + prefill.counts[i] for i in done],
                ],
                self.device,
            )
            self.pending_tokens[indices, 0] = prefill.next_token_ids[last]
            self.pending_start[indices] = length
            self.pending_count.index_fill_(0, indices, 1)

    def update(self, verified: Verified) -> None:
        rows = verified.rows
        self.pending_tokens[rows.req_indices] = verified.next_tokens(self.width)
        self.pending_start[rows.req_indices] = rows.lengths + 1
        self.pending_count[rows.req_indices] = verified.result.num_correct_drafts + 1

    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        b, w = rows.size, self.width
        start, count = self.pending_start[rows.req_indices], self.pending_count[rows.req_indices]
        with rows.context(start, w, self.backend) as ctx:
            ctx.recurrent = self.states.verify(
                rows.req_indices, start, None
            )  # a snapshot after each pending row
            out = self._forward(
                self.pending_tokens[rows.req_indices].reshape(-1), ctx.metadata.token_positions
            )
        hidden = out.view(b, w, -1)[
            torch.arange(b, device=out.device), count - 1
        ]  # row L's output [b, hidden]
        self.states.commit(
            rows.req_indices, count - 1
        )  # the state after token L, the last committed one
        tokens, probs = [], []
        for j in range(1, shape.num_steps + 1):
            tokens.append(choose_chain(self._logits(hidden), rows, j, probs))
            if j < shape.num_steps:  # the row reading draft j sits at position L + j
                row = rows.lengths + j
                with rows.context(row, 1, self.backend) as ctx:
                    ctx.recurrent = self._advance(rows.req_indices)
                    hidden = self._forward(tokens[-1], row)
        if shape.num_steps > 1:
            self.states.commit(rows.req_indices, count - 1)  # back to the state after token L
        return chain_drafts(rows, tokens, probs)
