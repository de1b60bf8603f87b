"""DFlash proposer: one non-causal draft forward per step proposes a whole block of drafts (a chain).

Row convention: the draft keeps paged KV at the same rows as the target (same block tables). Draft
KV row t is *context*: in every draft layer, the k/v of the feature ``c_t = hidden_norm(fc(aux_t))``
of target row t, rotated at position t (``DFlashDraft.write_context``). Let L be a request's length:
its last token sits at position L with no KV yet. ``draft`` runs one forward over the block
``[token L, mask x (B - 1)]`` at rows/positions L .. L + B - 1 (B = the draft's block size =
num_steps + 1), non-causal over the block (a full custom mask) and seeing every context row < L;
block row i >= 1 gives draft i (the token at L + i). The block's own KV lands at rows L .. L + B - 1.

State: nothing per row but that KV (``state()`` is empty). A row's context is written as soon as
the target has computed it: ``absorb`` writes every prefill row, ``update`` every row of the verified
chain, L .. L + n - 1 (n = the verified nodes). The committed ones, L .. L + a, are the next block's
context; the rejected ones lie at rows >= the new length L' = L + a + 1 and n <= B, so inside the
next block's rows L' .. L' + B - 1, which its forward writes in each layer before that layer attends
(and a step drafting nothing leaves them to the next ``update``, which writes from L' on). So every
context row a block reads holds its committed feature, and a step run ahead and then dropped needs no
restore: it wrote only rows past every committed row.
"""

from __future__ import annotations

from pathlib import Path

import torch

from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.layers.decoder import pack_projections
from outpace.models.drafts.dflash import dflash_block_size, load_dflash_draft
from outpace.speculative.chain import chain_drafts, choose_chain
from outpace.speculative.hot_vocab import readouts
from outpace.speculative.proposer import (
    DecodeRows,
    Drafts,
    DraftShape,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.speculative.rows import prefill_extension
from outpace.validation import ConfigError, read_json_object


class DFlashProposer(Proposer):
    draft_checkpoint_tensor = "fc.weight"  # the fusion of the target's hidden features
    takes_token_map = True  # the draft predicts with the target's head

    @classmethod
    def default_num_steps(cls, draft_dir: Path) -> int:
        """The draft's block size - 1: a block is the bonus token and one mask per draft step."""
        return dflash_block_size(draft_dir) - 1

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
        super().__init__(spec, pool, max_requests, device, attention_backend)
        if spec.topk != 1:
            raise ConfigError(
                f"SpeculativeConfig.topk={spec.topk} is invalid for dflash: must be 1 (a DFlash "
                "block is verified as a chain)"
            )
        self.draft_model = load_dflash_draft(spec.draft, target, dtype, device)
        pack_projections(self.draft_model)  # one matmul for q/k/v and for gate/up
        cfg = self.draft_model.config
        if spec.num_draft_tokens != cfg.block_size:
            path = Path(spec.draft) / "config.json"
            raise ConfigError(
                f"SpeculativeConfig.num_steps={spec.num_steps} is invalid for the DFlash draft: "
                f"{path}: {_block_size_field(path)} is {cfg.block_size}, and num_steps + 1 "
                f"(= {spec.num_steps + 1}) must equal block_size; use num_steps={cfg.block_size - 1}"
            )
        self.block_size, self.mask_token_id = cfg.block_size, cfg.mask_token_id
        # the draft's head, or with a token map its rows of the map's tokens (speculative/hot_vocab.py)
        (self.readout,) = readouts(
            [(self.draft_model.norm, self.draft_model.head)],
            spec.token_map,
            target.config.vocab_size,
        )
        self.aux_layer_ids = cfg.capture_layer_ids
        bind_kv_cache(self.draft_model, pool, dtype, device)
        self.dtype = dtype

    @property
    def lookahead(self) -> int:
        return self.block_size - 1

    # ---- context rows --------------------------------------------------------------------------
    def absorb(self, prefill: PrefillRows) -> None:
        ext = prefill_extension(
            prefill, [0] * len(prefill.counts), self.pool.block_size
        )  # every row
        if ext is not None:
            features = self.draft_model.fuse(
                prefill.aux_hidden_states[prefill.rows[ext.rows]]
            )  # [m, hidden]
            self.draft_model.write_context(features, ext.positions, ext.metadata.slot_mapping)

    # a prompt's context rows may be written as captured (engine/prefill_graphs.py): every row, none kept
    captures_absorb = True

    def absorb_buffer(self, rows: int) -> torch.Tensor:
        draft = self.draft_model  # the target's aux states, concatenated
        width = draft.config.num_features * draft.target_hidden_size
        return torch.zeros(rows, width, dtype=self.dtype, device=self.device)

    def absorb_rows(self, prefill: PrefillRows) -> torch.Tensor:
        return prefill.aux_hidden_states[prefill.rows]  # [total, num_features * target hidden]

    def absorb_layers(self, meta, token_ids, next_ids, rows) -> None:
        self.draft_model.write_context(
            self.draft_model.fuse(rows), meta.token_positions, meta.slot_mapping
        )

    def absorb_state(self, prefill: PrefillRows) -> None:
        pass  # (the context rows are the whole of it)

    def update(self, verified: Verified) -> None:
        rows = verified.rows
        n = verified.aux_hidden_states.shape[0] // rows.size  # verified nodes per row
        kv_rows = rows.lengths[:, None] + torch.arange(
            n, device=rows.lengths.device
        )  # [b, n]: node i at L + i
        self.draft_model.write_context(
            self.draft_model.fuse(verified.aux_hidden_states),
            kv_rows.reshape(-1),
            rows.cache_slots(kv_rows).reshape(-1),
        )

    # ---- drafting ------------------------------------------------------------------------------
    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        k = shape.num_steps
        probs: list[torch.Tensor] = []
        # greedy rows: the head's argmax in one launch (layers/fused_decoder.py), no logits written
        if k and rows.sampling.all_greedy:
            tokens = list(
                self.readout.greedy_tokens(self.block_rows(rows, k)).view(rows.size, k).unbind(1)
            )
        else:
            logits = self.block_logits(rows, k) if k else None  # [b, k, vocab]
            tokens = [choose_chain(logits[:, j - 1], rows, j, probs) for j in range(1, k + 1)]
        return chain_drafts(rows, tokens, probs)

    def block_logits(self, rows: DecodeRows, k: int) -> torch.Tensor:
        """One draft forward over every row's block -> the logits of block rows 1 .. k, [b, k, vocab]."""
        return self.readout.logits(self.block_rows(rows, k)).view(rows.size, k, -1)

    def block_rows(self, rows: DecodeRows, k: int) -> torch.Tensor:
        """One draft forward over every row's block -> its rows 1 .. k, pre-norm, [b * k, hidden]."""
        b, n = rows.size, self.block_size
        ids = torch.cat(
            [rows.last_tokens[:, None], rows.last_tokens.new_full((b, n - 1), self.mask_token_id)],
            1,
        )
        full = torch.ones(b, n, n, dtype=torch.bool, device=ids.device)  # non-causal over the block
        with rows.context(rows.lengths, n, self.backend, full) as ctx:
            hidden = self.draft_model(
                ids.reshape(-1), ctx.metadata.token_positions
            )  # [b * n, hidden]
        return hidden.view(b, n, -1)[:, 1 : k + 1].reshape(b * k, -1)


def _block_size_field(path: Path) -> str:
    """Where config.json ``path`` gives the block size: dflash_config.block_size, else the top level's."""
    dflash = read_json_object(path).get("dflash_config")
    inside = isinstance(dflash, dict) and dflash.get("block_size") is not None
    return "dflash_config.block_size" if inside else "block_size"
