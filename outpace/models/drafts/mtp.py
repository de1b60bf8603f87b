"""Multi-token-prediction layers, in two checkpoint layouts.

Given the embedding of token t+1 and a hidden state for position t, an MTP layer predicts token
t+2: ``h = eh_proj(concat(enorm(embed(t+1)), hnorm(hidden_t)))`` then one decoder layer, whose
pre-norm output gives the logits.
Checkpoint names: ``model.layers.{num_hidden_layers + k}.{enorm,hnorm,eh_proj,self_attn,...}``.

``MTPLayer`` (what outpace trains): the embedding, final norm and head are the target's. Chained,
layer 0 consumes the target's last pre-norm hidden state and layer k the pre-norm output of layer
k-1, each predicting one token further ahead; not chained, every layer consumes the target's state.
Step-3.5-Flash's layers (models/step3p5.py) are ``MTPBlock``s chained the same way over the target's
embedding and pre-norm state, with zero-centred norms and a head of their own.

``OwnHeadsMTPBlock`` (DeepSeek-V3, ``model.layers.61.*``): the layer carries its own
``embed_tokens`` and ``shared_head.{norm,head}`` tensors. Its semantics, as vLLM's deepseek_mtp.py
(DeepSeekMultiTokenPredictorLayer, SharedHead) and SGLang's deepseek_nextn.py serve it:
- it reads the target's hidden state *after* the final norm (vLLM's DeepseekV2Model.forward returns
  ``self.norm(hidden_states, residual)``, and that is the state the MTP layer is given); further
  steps read the MTP layer's own pre-norm output (vLLM's EagleProposer feeds the returned state
  back), so the form is always chained;
- the embedding of the row at position 0 is zeroed before ``enorm`` ("masking inputs at position 0,
  as not needed by MTP", vLLM);
- ``eh_proj`` reads ``[enorm(embedding), hnorm(hidden)]`` in that order (vLLM and SGLang);
- logits are ``shared_head.head(shared_head.norm(h))``: the layer's own norm precedes its own head,
  not the target's final norm.
Each layer uses the ``embed_tokens`` stored under its own name; vLLM loads only the first MTP
layer's and shares it ("MTP modules share the embedding layer", DeepSeek-V3 report), which is the
same as long as the copies are equal (DeepSeek-V3 has a single MTP layer).

The MTP parts are mixins over a decoder layer class: ``MTPLayer`` and ``DeepSeekMTPLayer`` put them
over a Llama-family block; models/deepseek.py puts ``OwnHeadsMTPBlock`` over a DeepSeek block (MLA and
MoE or dense MLP), as vLLM's DeepSeekMultiTokenPredictorLayer wraps a DeepseekV2DecoderLayer.
"""

from __future__ import annotations

import torch
from torch import nn

from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.fused_decoder import (
    FusedDecoderLayer,
    embed_norm_pair,
    head_logits,
    run_layer,
)
from outpace.layers.linear import linear
from outpace.layers.norm import RMSNorm
from outpace.layers.rotary import RotaryEmbedding
from outpace.model_config import ModelConfig


def has_own_mtp_heads(cfg: ModelConfig, tensor_names: set[str]) -> bool:
    """Whether a checkpoint stores its MTP layers DeepSeek-V3 style: the first MTP layer has a
    ``shared_head.head`` (vLLM deepseek_mtp.py: spec-layer weights ``embed_tokens``, ``enorm``,
    ``hnorm``, ``eh_proj``, ``shared_head``)."""
    return (
        cfg.num_nextn_predict_layers > 0
        and f"model.layers.{cfg.num_hidden_layers}.shared_head.head.weight" in tensor_names
    )


def input_pair_fuses(hidden: torch.Tensor, table: nn.Module, *norms: nn.Module) -> bool:
    """Whether ``mtp_input`` takes its one launch: hidden [n, hidden] in half precision on the GPU, autograd off,
    the embedding one unsharded table of that dtype, and both norms with a weight. Any number of rows (a program
    a row, whose arithmetic does not depend on the others: batch-invariant as it is)."""
    return (
        all(norm.weight is not None for norm in norms)
        and hidden.is_cuda
        and hidden.dtype in (torch.bfloat16, torch.float16)
        and not torch.is_grad_enabled()
        and type(table) is VocabEmbedding
        and table.group.size == 1
        and table.weight.dtype == hidden.dtype
        and table.weight.is_contiguous()
    )


def mtp_input(
    layer: nn.Module,
    target: nn.Module,
    token_ids: torch.Tensor,
    hidden: torch.Tensor,
    embed_norm: nn.Module,
    hidden_norm: nn.Module,
) -> torch.Tensor:
    """What an MTP layer's first projection reads (``eh_proj``; Qwen's ``fc``): [embed_norm(embed(token_ids)) |
    hidden_norm(hidden)] [n, 2 * hidden] for token_ids [n] and hidden [n, hidden], the embedding ``layer.embed``'s
    (the target's, or the layer's own), cast to the hidden state's dtype (a layer trained in float32 over a bf16
    target). Where ``input_pair_fuses``, one launch (layers/fused_decoder.py ``embed_norm_pair``, each norm's
    weight applied in float32 with its offset, as ``Float32RMSNorm`` does; an ``RMSNorm`` rounds before its
    weight, so there a draft may differ in the last bit): a draft pass on the H200 spent four launches on the
    gather, the two norms and their concatenation (benchmarks/results/gpu_2026-12-02 call 4, about 10 us a pass
    at the widened Qwen3.5's shape)."""
    table = layer.embedding(target)
    return embed_norm_pair(
        token_ids,
        table,
        embed_norm,
        hidden,
        hidden_norm,
        input_pair_fuses(hidden, table, embed_norm, hidden_norm),
        lambda ids: layer.embed(target, ids).to(hidden.dtype),
    )


def build_mtp_layers(cfg: ModelConfig, rotary: RotaryEmbedding, own_heads: bool) -> nn.ModuleList:
    layer = DeepSeekMTPLayer if own_heads else MTPLayer
    return nn.ModuleList(layer(cfg, rotary) for _ in range(cfg.num_nextn_predict_layers))


class DraftHead:
    """How an MTP layer's drafts are read (a mixin): ``head_parts`` names the norm and the head, and the logits
    follow from them, as do the drafts (speculative/hot_vocab.py ``Readout``: the head, or its rows of a token
    map's tokens)."""

    def head_parts(self, target: nn.Module) -> tuple[nn.Module | None, nn.Module]:
        """(the norm the head reads this layer's output through, None where the output comes normed; the head)."""
        raise NotImplementedError

    def compute_logits(self, target: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] this layer's output -> [n, vocab] float32 logits (what training fits; drafting reads the
        head through speculative/hot_vocab.py ``Readout``, in one launch for greedy drafts)."""
        norm, head = self.head_parts(target)
        return head_logits(norm, head, hidden)


class MTPBlock(DraftHead, nn.Module):
    """The MTP parts of a layer, over the decoder layer class that follows this one in the MRO (whose
    forward is ``forward(positions, h)``): ``class X(MTPBlock, SomeDecoderLayer)``. Checkpoint names of
    both sit side by side under ``model.layers.{num_hidden_layers + k}``. Constructor arguments are the
    decoder layer's; the first is a config with ``hidden_size`` and ``rms_norm_eps``."""

    chained_by_layout = False  # whether the layout fixes the chained form (else the config's flag)

    def __init__(self, cfg, *layer_args) -> None:
        super().__init__(cfg, *layer_args)
        self.enorm = self.input_norm(cfg)
        self.hnorm = self.input_norm(cfg)
        self.eh_proj = linear(2 * cfg.hidden_size, cfg.hidden_size)

    def input_norm(self, cfg) -> nn.Module:
        """The kind of norm ``enorm`` and ``hnorm`` are (Step-3.5-Flash's are zero-centred: models/step3p5.py)."""
        return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def head_norm(self) -> nn.Module | None:
        """The norm that reads this layer's output first, where the layer has a head of its own (DeepSeek-V3's,
        Step-3.5-Flash's): ``forward`` runs the decoder layer as a fused stack of one (layers/fused_decoder.py
        ``run_layer``), its output made ready for that norm. None: the decoder layer's forward chooses its
        kernels itself (outpace's Llama-family layers: ``FusedDecoderLayer``)."""
        return None

    def forward(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,  # type: ignore[override]
        hidden_states: torch.Tensor,
        target: nn.Module,
    ) -> torch.Tensor:
        """token_ids [n] (token t+1, embedded by ``embed``); hidden_states [n, hidden] at t -> [n, hidden]
        pre-norm."""
        h = self.eh_proj(self.fc_input(positions, token_ids, hidden_states, target))
        norm = self.head_norm()
        if norm is None:
            return super().forward(positions, h)
        return run_layer(self, positions, h, norm)

    def fc_input(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        target: nn.Module,
    ) -> torch.Tensor:
        """[enorm(embedding) | hnorm(hidden)] [n, 2 * hidden], what ``eh_proj`` reads (``mtp_input``)."""
        return mtp_input(self, target, token_ids, hidden_states, self.enorm, self.hnorm)

    def target_state(self, target: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        """The target's last pre-norm hidden states [n, hidden] -> what this layer reads."""
        return hidden

    def embedding(self, target: nn.Module) -> nn.Module:
        """The table ``embed`` reads (the target's)."""
        return target.model.embed_tokens

    def embed(self, target: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        """token_ids [n] -> [n, hidden]."""
        return target.embed(token_ids)

    def head_parts(self, target: nn.Module) -> tuple[nn.Module | None, nn.Module]:
        """The target's final norm and head (a Llama-family target's ``compute_logits``)."""
        return target.model.norm, target.lm_head


class SharedHead(nn.Module):
    """DeepSeek-V3's per-MTP-layer output head: ``norm`` then ``head`` (vLLM deepseek_mtp.py SharedHead)."""

    def __init__(self, cfg) -> None:
        """cfg: ``hidden_size``, ``rms_norm_eps``, ``vocab_size``."""
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = LMHead(cfg.hidden_size, cfg.vocab_size)


class OwnHeadsMTPBlock(MTPBlock):
    """``MTPBlock`` with its own ``embed_tokens`` and ``shared_head`` (module docstring for the semantics);
    the config also gives ``vocab_size``."""

    chained_by_layout = True

    def __init__(self, cfg, *layer_args) -> None:
        super().__init__(cfg, *layer_args)
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size)
        self.shared_head = SharedHead(cfg)

    def head_norm(self) -> nn.Module:
        return self.shared_head.norm

    def fc_input(
        self,
        positions: torch.Tensor,
        token_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        target: nn.Module,
    ) -> torch.Tensor:
        x = super().fc_input(positions, token_ids, hidden_states, target)  # a new tensor
        # vLLM masks the embedding at position 0: enorm of a zero row is zero, so its half is zeroed after
        x[:, : hidden_states.shape[-1]].masked_fill_((positions == 0)[:, None], 0.0)
        return x

    def target_state(self, target: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
        return target.model.norm(hidden)  # post-norm, as vLLM's DeepseekV2Model returns it

    def embedding(self, target: nn.Module) -> nn.Module:
        return self.embed_tokens

    def embed(self, target: nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    def head_parts(self, target: nn.Module) -> tuple[nn.Module | None, nn.Module]:
        return self.shared_head.norm, self.shared_head.head


class MTPLayer(MTPBlock, FusedDecoderLayer):
    """A Llama-family MTP layer in the target's own layout (outpace's trained ones)."""


class DeepSeekMTPLayer(OwnHeadsMTPBlock, FusedDecoderLayer):
    """A Llama-family decoder block in DeepSeek-V3's MTP layout."""
