"""Gemma 4 assistant proposer: a Gemma4AssistantForCausalLM checkpoint drafts for its Gemma 4 target
(models/drafts/gemma4_assistant.py), chains only.

Let L be a request's length (its last token, committed, sits at position L with no KV yet). Every step of
a draft is one row at position L whose layers attend over the target's own KV rows 0 .. L - 1 (the
forward context puts the query at KV row L - 1, so nothing past it is read and nothing is written):
step 1 reads [the target's embedding of the last token | the target's normed hidden state at row L - 1],
step j > 1 [the embedding of draft j - 1 | step j - 1's projected state] (transformers
SinglePositionMultiTokenCandidateGenerator.get_candidates).

State per row: the target's pre-norm hidden state at row L - 1, that is the last committed row of the
last verify (or of the prompt). The assistant keeps no KV, so ``update`` and ``absorb`` only record it.
"""

from __future__ import annotations

import torch

from outpace.cache.block_pool import BlockPool
from outpace.config import SpeculativeConfig
from outpace.host_copies import to_device
from outpace.layers.decoder import pack_projections
from outpace.models.drafts.gemma4_assistant import load_gemma4_assistant
from outpace.speculative.chain import chain_drafts, choose_chain
from outpace.speculative.proposer import (
    DecodeRows,
    Drafts,
    DraftShape,
    PrefillRows,
    Proposer,
    Verified,
)
from outpace.validation import ConfigError


class Gemma4AssistantProposer(Proposer):
    draft_checkpoint_tensor = (
        "pre_projection.weight"  # [token embedding | target state] -> the assistant's width
    )

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
                f"SpeculativeConfig.topk={spec.topk} is invalid for gemma4_assistant: must be 1 "
                f"(a chain: every step sits at one position)"
            )
        super().__init__(spec, pool, max_requests, device, attention_backend)
        self.draft_model = load_gemma4_assistant(spec.draft, target, dtype, device)
        pack_projections(self.draft_model)  # one matmul for gate/up
        # the target's pre-norm state at each row's row L - 1
        self.last_hidden = torch.zeros(
            max_requests + 1, target.config.hidden_size, dtype=dtype, device=self.device
        )

    @property
    def lookahead(self) -> int:
        return self.spec.num_steps  # the verify's rows reach L + num_steps; drafting writes none

    def state(self) -> list[torch.Tensor]:
        return [self.last_hidden]

    def absorb(self, prefill: PrefillRows) -> None:
        # [2, chunks]: each request's row, its last row in the prefill
        indices, last = to_device(
            [prefill.req_indices, prefill.last_rows],
            self.device,
        )
        self.last_hidden[indices] = prefill.hidden_states[prefill.rows[last]].to(
            self.last_hidden.dtype
        )

    def update(self, verified: Verified) -> None:
        last = verified.committed_rows(self.spec.num_steps + 1)[
            :, -1
        ]  # [b] the last committed node
        self.last_hidden[verified.rows.req_indices] = verified.hidden_states.index_select(0, last)

    def draft(self, rows: DecodeRows, shape: DraftShape) -> Drafts:
        tokens, probs = [], []
        token, hidden = (
            rows.last_tokens,
            self.draft_model.target_state(self.last_hidden[rows.req_indices]),
        )
        if shape.num_steps:
            # NOTE: padded rows (length 0) read row 0 of the padding block
            with rows.context((rows.lengths - 1).clamp(min=0), 1, self.backend):
                for j in range(1, shape.num_steps + 1):
                    logits, hidden = self.draft_model(token, rows.lengths, hidden)
                    token = choose_chain(logits, rows, j, probs)
                    tokens.append(token)
        return chain_drafts(rows, tokens, probs)
