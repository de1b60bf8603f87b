"""The multi-token-prediction (MTP) module of Nemotron-H checkpoints (Nemotron 3 Super: ``mtp.*`` tensors,
config.json's ``num_nextn_predict_layers`` and ``mtp_layers_block_type``) as vLLM's nemotron_h_mtp.py
(NemotronHMultiTokenPredictor, NemotronHMTP) serves it:

- a short stack of Nemotron-H blocks ``mtp.layers.{i}`` (models/nemotron_h.py ``NemotronHBlock``, each
  ``x + mixer(norm(x))``), one per entry of ``mtp_layers_block_type`` (transformers' NemotronHConfig default
  ["full_attention", "moe"]; older configs say ``mtp_hybrid_override_pattern`` "*E"); vLLM builds attention and
  MoE blocks only; the attention block has its own paged KV;
- the first block also holds ``enorm`` and ``hnorm`` (RMSNorms) and ``eh_proj`` (no bias), which reads
  ``[enorm(embed(t + 1)) | hnorm(h_t)]``, the embedding first; the last block holds ``final_layernorm``, applied
  to the stack's output stream. That normed state is what a step returns: the logits are the target's
  ``lm_head`` of it, and a further step reads it as its hidden state;
- h_t of the first step is the target's last hidden state after its final norm ``norm_f`` (vLLM's
  NemotronHForCausalLM applies ``lm_head`` straight to its model's output, so that output is normed);
- the embedding and ``lm_head`` are the target's;
- one MTP step (vLLM asserts ``num_nextn_predict_layers`` == 1), which every draft step reuses.

Here ``enorm``, ``hnorm``, ``eh_proj`` and ``final_layernorm`` belong to the module itself; ``checkpoint_name``
places them under the first and the last block's names.
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.layers.fused_decoder import run_stack
from outpace.layers.linear import linear
from outpace.layers.norm import Float32RMSNorm
from outpace.models.drafts.hybrid_mtp import NormedMTPStep
from outpace.models.drafts.mtp import mtp_input

_FIRST_BLOCK_PARTS = ("enorm.", "hnorm.", "eh_proj.")


class NemotronHMTP(nn.Module):
    """The checkpoint's ``mtp.*`` tensors: blocks built by the model file and the parts around them (module
    docstring)."""

    def __init__(self, hidden_size: int, eps: float, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.enorm = Float32RMSNorm(hidden_size, eps)
        self.hnorm = Float32RMSNorm(hidden_size, eps)
        self.eh_proj = linear(2 * hidden_size, hidden_size)
        self.layers = nn.ModuleList(blocks)
        self.final_layernorm = Float32RMSNorm(hidden_size, eps)

    def steps(self) -> nn.ModuleList:
        """The one ``NemotronHMTPStep``, sharing this module's parameters."""
        return nn.ModuleList([NemotronHMTPStep(self)])

    def checkpoint_name(self, name: str) -> str:
        """A parameter name under this module (``eh_proj.weight``) -> the checkpoint's, under ``mtp.``
        (``layers.0.eh_proj.weight``)."""
        if name.startswith(_FIRST_BLOCK_PARTS):
            return f"layers.0.{name}"
        if name.startswith("final_layernorm."):
            return f"layers.{len(self.layers) - 1}.{name}"
        return name


class NemotronHMTPStep(NormedMTPStep):
    """The MTP stack as one draft step (module docstring)."""

    def __init__(self, mtp: NemotronHMTP) -> None:
        super().__init__()
        # (the shared parts one by one, not the parent module: no cycle in the module tree)
        self.enorm, self.hnorm, self.eh_proj = mtp.enorm, mtp.hnorm, mtp.eh_proj
        self.blocks, self.final_layernorm = mtp.layers, mtp.final_layernorm

    def forward(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        target: nn.Module,
    ) -> torch.Tensor:
        """token_ids [n] (token t + 1, embedded by ``embed``), hidden_states [n, hidden] for t -> [n, hidden]
        normed. The blocks run as a fused stack where every block takes that path (layers/fused_decoder.py
        ``run_stack``: the output made ready for ``final_layernorm``)."""
        x = mtp_input(
            self, target, token_ids, hidden_states, self.enorm, self.hnorm
        )  # [n, 2 * hidden]
        blocks = list(self.blocks)
        norms = [block.norm for block in blocks]
        h = run_stack(blocks, norms, self.final_layernorm, positions, self.eh_proj(x), ())[0]
        return self.final_layernorm(h)
