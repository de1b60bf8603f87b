"""Standalone draft model: any model outpace loads, with the target's tokenizer, drafting
autoregressively. Its paged KV lives at the same rows as the target's (shared block tables): each
propose first runs the rows committed since the last one plus the bonus token's row, then one
row per further draft step.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import ConfigError, ModelConfig, SpeculativeConfig
from outpace.request import Request
from outpace.models.loader import load_model
from outpace.speculative.chain import ChainDrafts
from outpace.speculative.proposer import CommittedRows, DraftBatch, Proposer
from outpace.speculative.rows import draft_rows, row_positions


def shared_vocab_size(target_dir: Path, draft_dir: Path) -> int:
    """The number of token ids a draft may propose: the draft must tokenize exactly as the target.

    When both directories carry a tokenizer.json, their token -> id maps (the model's vocabulary and
    the added tokens) must be equal; the embeddings may then be padded to different sizes (e.g.
    Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, over the same 151665 tokens), and the shared
    size is the tokenizer's: the ids past it are padding rows of the embedding, which no text ever
    produces. Without both tokenizer.json files the vocab sizes must be equal, and that is the size.
    """
    t, d = ModelConfig.from_pretrained(target_dir), ModelConfig.from_pretrained(draft_dir)
    files = [Path(target_dir) / "tokenizer.json", Path(draft_dir) / "tokenizer.json"]
    if not all(f.is_file() for f in files):
        if t.vocab_size != d.vocab_size:
            raise ConfigError(f"draft {draft_dir} has vocab_size {d.vocab_size}, the target {t.vocab_size}, and "
                              f"without a tokenizer.json in both directories their tokenizers cannot be compared: "
                              f"a draft model must share the target's tokenizer")
        return t.vocab_size
    target_ids, draft_ids = (_token_ids(json.loads(f.read_text())) for f in files)
    if target_ids != draft_ids:
        raise ConfigError(f"draft {draft_dir} has a different tokenizer from the target {target_dir} "
                          f"(their tokenizer.json vocabularies differ)")
    size = max(target_ids.values()) + 1
    if size > min(t.vocab_size, d.vocab_size):
        raise ConfigError(f"the tokenizer of {target_dir} has ids up to {size - 1}, beyond the embedding rows of the "
                          f"target ({t.vocab_size}) or of the draft {draft_dir} ({d.vocab_size})")
    return size


def _token_ids(tokenizer: dict) -> dict[str, int]:
    """A tokenizer.json's token -> id map: the model's vocabulary (a token -> id dict, or for Unigram
    models a list of [token, score] in id order) and the added (special) tokens."""
    vocab = tokenizer["model"].get("vocab") or {}
    ids = {tok: i for i, (tok, _) in enumerate(vocab)} if isinstance(vocab, list) else dict(vocab)
    ids.update({t["content"]: t["id"] for t in tokenizer.get("added_tokens", [])})
    return ids


class DraftModelProposer(Proposer):
    def __init__(self, spec: SpeculativeConfig, target, pool: BlockPool, dtype: torch.dtype, device: str,
                 attention_backend: str = "torch") -> None:
        if spec.topk != 1:
            raise ConfigError(f"SpeculativeConfig.topk={spec.topk} is invalid for draft: must be 1 (a chain)")
        self.vocab_size = target.config.vocab_size
        self.shared_vocab = shared_vocab_size(target.checkpoint_dir, Path(spec.draft))
        super().__init__(spec, pool, device, attention_backend)
        # rotary tables over the target's whole context (models/loader.py covering_positions)
        self.draft = load_model(spec.draft, dtype, device, progress=False,
                                min_positions=target.config.max_position_embeddings)
        bind_kv_cache(self.draft.model, pool, dtype, device)
        self._next_row: dict[str, int] = {}  # first row whose draft KV is not final

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps

    def release(self, request_id: str) -> None:
        self._next_row.pop(request_id, None)

    def observe(self, committed: CommittedRows) -> None:
        for req, start in zip(committed.requests, committed.starts):
            self._next_row.setdefault(req.request_id, start)

    def _forward(self, requests, starts, counts, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [num_rows]: committed or drafted ids. A padding id of the target's embedding (one no
        text produces, but which a target may still emit) is read by the draft as id 0 rather than past
        its own embedding: it can only change what the draft proposes, never what is committed."""
        token_ids = token_ids.masked_fill(token_ids >= self.shared_vocab, 0)
        with draft_rows(self.pool, self.backend, requests, starts, counts, self.device):
            return self.draft(token_ids, row_positions(starts, counts, self.device)).hidden_states

    def _to_target_logits(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[n, draft_vocab] -> [n, target vocab]: the shared ids' logits, -inf elsewhere (padding rows
        of either embedding are never drafted)."""
        full = draft_logits.new_full((draft_logits.shape[0], self.vocab_size), float("-inf"))
        full[:, :self.shared_vocab] = draft_logits[:, :self.shared_vocab]
        return full

    def propose(self, requests: list[Request]) -> DraftBatch:
        drafts = ChainDrafts(requests, self.device)
        with torch.inference_mode():
            starts = [self._next_row[r.request_id] for r in requests]
            counts = [r.num_tokens - s for r, s in zip(requests, starts)]  # committed rows and the bonus row
            tokens = torch.tensor([t for r, s in zip(requests, starts) for t in r.token_ids[s:]],
                                  dtype=torch.int64, device=self.device)
            out = self._forward(requests, starts, counts, tokens)
            last = (torch.tensor(counts).cumsum(0) - 1).to(self.device)
            token = drafts.choose(self._to_target_logits(self.draft.compute_logits(out[last])))
            for j in range(1, self.spec.num_steps):
                rows = [r.num_tokens + j - 1 for r in requests]
                token = drafts.choose(self._to_target_logits(self.draft.compute_logits(
                    self._forward(requests, rows, [1] * len(requests), token))))
            for r in requests:  # the bonus row is final; the drafted rows after it are not
                self._next_row[r.request_id] = r.num_tokens
        return drafts.batch()
