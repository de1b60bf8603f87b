"""The multi-token-prediction (MTP) module of Qwen3-Next and Qwen3.5 checkpoints (``mtp.*`` tensors), as
vLLM's qwen3_next_mtp.py (Qwen3NextMultiTokenPredictor, Qwen3NextMTP; vLLM serves Qwen3.5 through the same
``qwen3_next_mtp`` method) and SGLang's qwen3_5_mtp.py (Qwen3_5ForCausalLMMTP) serve it:

- ``mtp.fc`` (no bias) reads ``[pre_fc_norm_embedding(embed(t + 1)), pre_fc_norm_hidden(h_t)]``, the
  embedding first (both anchors concatenate in that order);
- then one decoder layer ``mtp.layers.{k}``: a full-attention layer of the target's kind (gated attention,
  partial RoPE; vLLM builds Qwen3NextDecoderLayer(layer_type="full_attention") whose MLP is the mixture of
  experts by the target's rule at index k: vLLM extract_layer_index of "mtp.layers.{k}"), with its own
  paged KV;
- then ``mtp.norm``; that normed state is what the MTP returns (vLLM's forward ends in
  ``self.norm(hidden_states, residual)``): the logits are the target's ``lm_head`` of it, with no further
  norm (vLLM Qwen3NextMTP.compute_logits), and a further draft step reads it as its hidden state;
- the embedding and the head are the target's (vLLM load_weights keeps ``embed_tokens`` and ``lm_head``
  from the target's names; Qwen's configs say ``mtp_use_dedicated_embeddings: false``);
- h_t of the first step is the target's last hidden state *after* its final norm (vLLM's Qwen3NextModel
  returns ``self.norm(hidden_states, residual)`` and that is the state the proposer hands on);
- no position-0 masking (unlike DeepSeek-V3's layers); the row at t sits at rotary position t;
- with several MTP layers, step k uses layer k, fc and the norms shared by all (vLLM:
  ``layers[spec_step_idx % num_mtp_layers]``). NOTE: released checkpoints have one layer, which every step
  reuses (vLLM's and outpace's forms agree there); with several, outpace runs each layer over every pending
  row, chained as Step-3.5's (speculative/drafters/mtp.py), where vLLM runs layers past the first over the drafted
  rows only, so their KV of committed rows differs.
Layer count: ``mtp_num_hidden_layers`` (Qwen3.5 and Qwen3-Next config.json), else
``num_nextn_predict_layers`` (the field vLLM's speculative config reads for ``qwen3_next_mtp``).

Each ``QwenMTPStep`` is one MTP layer as speculative/drafters/mtp.py drives it (``forward(positions, token_ids,
hidden, target)``, ``target_state``, ``embedding``, ``embed``, ``compute_logits``; models/drafts/mtp.py ``MTPBlock``
has the same interface); the layout chains (each step reads the previous step's returned state).
"""

from __future__ import annotations

import re

import torch
from torch import nn

from outpace.layers.fused_decoder import run_layer
from outpace.layers.linear import linear
from outpace.layers.norm import Float32RMSNorm
from outpace.models.drafts.mtp import DraftHead, mtp_input
from outpace.validation import MAX_CONFIG_SIZE, ConfigError, is_int

# Where a Qwen3-Next / Qwen3.5 config.json counts its MTP layers, the first given (module docstring)
MTP_COUNT_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers")


def mtp_layer_count(raw: dict) -> int:
    """The MTP layers a Qwen3-Next / Qwen3.5 config.json declares (module docstring). A count that is no integer
    >= 0 raises ``ConfigError`` naming the field (and the file, where the model class's constructor reads it:
    models/config_hooks.py ``ConfigHooks``)."""
    for key in MTP_COUNT_FIELDS:
        value = raw.get(key)
        if value is not None and not (is_int(value) and 0 <= value <= MAX_CONFIG_SIZE):
            raise ConfigError(
                f"field {key!r} must be an integer in [0, {MAX_CONFIG_SIZE}], got {value!r}"
            )
    return next((raw[key] for key in MTP_COUNT_FIELDS if raw.get(key)), 0)


def step_checkpoint_name(param_name: str) -> str:
    """A step's parameter as ``mtp_layers.{k}.*`` names it (``QwenMTPStep``'s attributes; the MTP recipe's names,
    train/recipes/mtp.py) -> the checkpoint's: step k's decoder layer under ``mtp.layers.{k}.``, the fc and
    norms the steps share under ``mtp.``. Other names are returned as they are."""
    m = re.fullmatch(r"mtp_layers\.(\d+)\.(layer\.)?(.+)", param_name)
    if m is None:
        return param_name
    k, own, rest = m.groups()
    return f"mtp.layers.{k}.{rest}" if own else f"mtp.{rest}"


class QwenMTP(nn.Module):
    """The checkpoint's ``mtp.*`` tensors: ``fc``, ``pre_fc_norm_embedding``, ``pre_fc_norm_hidden``,
    ``layers.{k}`` (decoder layers built by the model file) and ``norm``; norms scale by (1 + weight)."""

    def __init__(self, hidden_size: int, eps: float, layers: list[nn.Module]) -> None:
        super().__init__()
        self.fc = linear(2 * hidden_size, hidden_size)
        self.pre_fc_norm_embedding = Float32RMSNorm(hidden_size, eps, offset=1.0)
        self.pre_fc_norm_hidden = Float32RMSNorm(hidden_size, eps, offset=1.0)
        self.layers = nn.ModuleList(layers)
        self.norm = Float32RMSNorm(hidden_size, eps, offset=1.0)

    def steps(self) -> nn.ModuleList:
        """One ``QwenMTPStep`` per layer, sharing this module's parameters."""
        return nn.ModuleList(QwenMTPStep(self, k) for k in range(len(self.layers)))


class NormedMTPStep(DraftHead, nn.Module):
    """An MTP step whose output is already normed (Qwen3-Next / Qwen3.5 here, Nemotron-H in
    models/drafts/nemotron_h_mtp.py): it reads the target's state after its final norm, the target's head reads
    its output with no further norm, and a further step reads that output (the chained layout)."""

    chained_by_layout = True

    def target_state(self, target: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The target's last pre-norm hidden states [n, hidden] -> after its final norm."""
        return target.model.norm(hidden)

    def embedding(self, target: nn.Module) -> nn.Module:
        """The table ``embed`` reads (the target's)."""
        return target.model.embed_tokens

    def embed(self, target: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        return target.embed(token_ids)

    def head_parts(self, target: nn.Module) -> tuple[nn.Module | None, nn.Module]:
        """No norm (the output comes normed) and the target's head."""
        return None, target.lm_head


class QwenMTPStep(NormedMTPStep):
    """MTP layer k with the shared fc and norms (module docstring)."""

    def __init__(self, mtp: QwenMTP, k: int) -> None:
        super().__init__()
        # (the shared parts one by one, not the parent module: no cycle in the module tree)
        self.fc, self.layer, self.norm = mtp.fc, mtp.layers[k], mtp.norm
        self.pre_fc_norm_embedding, self.pre_fc_norm_hidden = (
            mtp.pre_fc_norm_embedding,
            mtp.pre_fc_norm_hidden,
        )

    def forward(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        target: nn.Module,
    ) -> torch.Tensor:
        """token_ids [n] (token t + 1, embedded by ``embed``), hidden_states [n, hidden] for t -> [n, hidden]
        normed. The decoder layer runs as a fused stack of one where it takes that path
        (layers/fused_decoder.py ``run_layer``: its output made ready for ``norm``)."""
        x = mtp_input(
            self,
            target,
            token_ids,
            hidden_states,
            self.pre_fc_norm_embedding,
            self.pre_fc_norm_hidden,
        )  # [n, 2 * hidden]
        return self.norm(run_layer(self.layer, positions, self.fc(x), self.norm))
