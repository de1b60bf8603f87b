"""DFlash draft model (block diffusion) in the format of public DFlash v1 checkpoints (``DFlashDraftModel``).

One draft forward proposes a whole block. Given target rows t < a, the *context features* are
``c_t = hidden_norm(fc(concat(target hidden states at the capture layers, row t)))``. The block is
``[x_a, mask, ..., mask]`` (``block_size`` rows at positions a .. a + B - 1), embedded with the
target's embedding. Each draft layer (Qwen3-style: per-head q/k RMSNorm) keeps a residual stream
over the block rows only; its queries come from the block rows, its keys and values from the
context features (the same c at every layer) and from the block rows, each rotated at its own
position. Attention is non-causal: every block row sees every context row < a and every block row.
After the final ``norm`` the target's head gives logits; block row i >= 1 predicts the token at
position a + i.

Checkpoint: ``config.json`` is a Qwen3 decoder config (``num_hidden_layers`` = draft layers,
``vocab_size`` = the target's) plus ``dflash_config: {block_size, mask_token_id, target_layer_ids}``
(``block_size`` / ``mask_token_id`` may also sit at the top level) and ``num_target_layers``.
``target_layer_ids`` mean "output of target layer X", i.e. outpace capture index X + 1 (always; no
second convention as with EAGLE3). Tensors: ``fc.weight`` [hidden, len(ids) * target_hidden],
``hidden_norm.weight``, ``layers.{i}.{input_layernorm, self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm,
post_attention_layernorm, mlp.{gate,up,down}_proj}.weight``, ``norm.weight``. No embedding, no head.

Two forwards share the same weights and the same math:
- serving (paged): ``write_context`` puts the context rows' k/v straight into each layer's KV cache,
  then ``forward`` runs the block rows through the usual paged attention under a full (non-causal)
  custom mask over the block, so they see the cached context rows and each other;
- training (dense): ``forward_dense`` takes context features as extra keys and an explicit mask, so
  many anchors of many sequences run in one batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from outpace.checkpoint import load_checkpoint, weight_files_named
from outpace.layers.fused_decoder import (
    FusedDecoderLayer,
    norm_head_logits,
    write_kv,
)
from outpace.layers.linear import linear
from outpace.layers.norm import RMSNorm
from outpace.model_config import ModelConfig, errors_name_file
from outpace.models.drafts.eagle3 import (
    DraftMismatchError,
    refuse_quantization_file,
    refuse_quantized,
    tensor_shapes,
)
from outpace.models.llama import build_rotary
from outpace.models.loader import default_dtype
from outpace.validation import (
    MAX_CONFIG_SIZE,
    ConfigError,
    ConfigFields,
    is_int,
    is_int64,
    read_json_object,
)


@dataclass(frozen=True)
class DFlashConfig:
    layer: ModelConfig  # decoder shapes; num_hidden_layers = draft layers, vocab = target's
    block_size: int  # rows per block: the bonus token + block_size - 1 masks
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # as in the checkpoint: "output of target layer X"
    num_target_layers: int | None = None

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> DFlashConfig:
        """``cfg``: the config.json object; every ``ConfigError`` names ``source`` (its path) and the field."""
        with errors_name_file(source):
            return cls._from_dict(cfg, source)

    @classmethod
    def _from_dict(cls, cfg: dict, source: str) -> DFlashConfig:
        fields = ConfigFields(cfg, source)
        _refuse_architecture(fields)
        dflash = fields.mapping("dflash_config") or ConfigFields({}, source, "dflash_config.")
        _refuse_unimplemented(fields, dflash)
        block_size = _dflash_field(fields, dflash, "block_size")
        mask_token_id = _dflash_field(fields, dflash, "mask_token_id")
        ids = _dflash_field(fields, dflash, "target_layer_ids")
        if not (is_int(block_size) and 2 <= block_size <= MAX_CONFIG_SIZE):
            raise ConfigError(
                f"{_where(dflash, 'block_size')}={block_size!r} is invalid: must be an integer >= 2 "
                "(the bonus token and at least one mask)"
            )
        if not (
            isinstance(ids, (list, tuple)) and ids and all(is_int64(i) and i >= 0 for i in ids)
        ):
            raise ConfigError(
                f"{_where(dflash, 'target_layer_ids')}={ids!r} is invalid: must be a non-empty list "
                "of layer ids (integers >= 0)"
            )
        if not (is_int64(mask_token_id) and mask_token_id >= 0):
            raise ConfigError(
                f"{_where(dflash, 'mask_token_id')}={mask_token_id!r} is invalid: must be an integer "
                "token id"
            )
        # Qwen3-style layers: per-head q/k RMSNorm (ModelConfig derives qk_norm from the architecture).
        layer = ModelConfig.from_dict({**cfg, "architectures": ["Qwen3ForCausalLM"]}, source)
        return cls(
            layer=layer,
            block_size=block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=tuple(ids),
            num_target_layers=fields.optional_integer("num_target_layers", None),
        )

    @property
    def capture_layer_ids(self) -> tuple[int, ...]:
        """outpace capture indices (input of layer i; index L = the last layer's output): X + 1."""
        return tuple(i + 1 for i in self.target_layer_ids)

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)


# z-lab dflash/model.py ``DFlashDraftModel`` (the public DFlash v1 drafts): its architecture, and the draft fields it
# reads from dflash_config, else the top level (``_draft_value``)
ARCHITECTURE = "DFlashDraftModel"
IMPLEMENTED_FIELDS = ("block_size", "mask_token_id", "target_layer_ids")
# field -> (the values that change nothing, what another does): z-lab's ``_raw_input_embeddings`` scales the
# block's embedding rows; ``compute_logits`` multiplies the logits and, by a positive cap, soft-caps them
# (tanh(x / cap) * cap). Refused at other values.
NEUTRAL_FIELDS = {
    "input_embedding_scale": ("1.0", "scaled block embeddings"),
    "output_multiplier": ("1.0", "scaled draft logits"),
    "final_logit_softcapping": ("null or <= 0", "soft-capped draft logits"),
}


def _is_neutral(key: str, value: float | None) -> bool:
    return value is None or (value <= 0 if key == "final_logit_softcapping" else value == 1.0)


def _refuse_architecture(fields: ConfigFields) -> None:
    """Other DFlash drafts are other networks: z-lab's DFlash2DraftModel (grouped convolutions and a candidate
    selector), SpecForge's DeepseekDFlashDraftModel (configs/deepseek-v2-lite-dflash.json: MLA layers)."""
    archs = fields.strings("architectures")
    if archs and archs[0] != ARCHITECTURE:
        raise fields.fail(
            "architectures",
            archs,
            f"absent or [{ARCHITECTURE!r}] (other DFlash draft networks are not implemented)",
        )


def _refuse_unimplemented(fields: ConfigFields, dflash: ConfigFields) -> None:
    """Refuse what changes the draft's output and is not implemented: a dflash_config field outside those
    z-lab's DFlashDraftModel reads (a later variant's, e.g. DFlash2's conv_kernel_size or selector_rank), one of
    ``NEUTRAL_FIELDS`` at another value, and ``is_causal`` true (z-lab's Qwen3DFlashAttention then masks the
    block causally; here the block is non-causal). (The layer's shapes, rope, attention_bias, hidden_act and
    sliding windows are ModelConfig's Qwen3 reading: windows are refused by ``load_dflash_draft``.
    tie_word_embeddings is harmless: the draft has no embedding or head of its own.)"""
    refuse_quantized(fields, "DFlash")
    known = (*IMPLEMENTED_FIELDS, *NEUTRAL_FIELDS)
    for key in dflash.data:
        if key not in known:
            raise dflash.fail(key, dflash.get(key), f"absent (known fields: {', '.join(known)})")
    for key, (neutral, what) in NEUTRAL_FIELDS.items():
        for where in (dflash, fields):
            value = where.number(key, None)
            if not _is_neutral(key, value):
                raise where.fail(key, value, f"{neutral} or absent ({what} are not implemented)")
    if fields.boolean("is_causal", False):
        raise fields.fail(
            "is_causal", True, "false or absent (a causal DFlash block is not implemented)"
        )


def _where(dflash: ConfigFields, name: str) -> str:
    return f"dflash_config.{name}" if dflash.get(name) is not None else name


def _dflash_field(fields: ConfigFields, dflash: ConfigFields, name: str):
    """dflash_config's ``name``, else the top level's (z-lab's ``_draft_value``); given in both, they must agree."""
    inner, outer = dflash.get(name), fields.get(name)
    if inner is None and outer is None:
        raise ConfigError(
            f"DFlash config has no {name} (looked in dflash_config and at the top level): "
            "not a DFlash draft checkpoint?"
        )
    if inner is not None and outer is not None and inner != outer:
        raise ConfigError(
            f"dflash_config.{name}={inner!r} and the top level's {name}={outer!r} disagree"
        )
    return outer if inner is None else inner


class DFlashDraft(nn.Module):
    def __init__(self, cfg: DFlashConfig, target_hidden_size: int) -> None:
        super().__init__()
        lc = cfg.layer
        self.config = cfg
        self.target_hidden_size = target_hidden_size
        self.rotary = build_rotary(lc)
        self.fc = linear(cfg.num_features * target_hidden_size, lc.hidden_size)
        self.hidden_norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        self.layers = nn.ModuleList(
            FusedDecoderLayer(lc, self.rotary) for _ in range(lc.num_hidden_layers)
        )
        self.norm = RMSNorm(lc.hidden_size, lc.rms_norm_eps)
        # (embedding, head) borrowed from the target; a tuple keeps them out of our submodules/state dict
        self._borrowed: tuple[nn.Module | None, nn.Module | None] = (None, None)

    def attach_target(self, target: nn.Module) -> None:
        self.borrow(target.model.embed_tokens, target.lm_head)

    def borrow(self, embed: Callable[[torch.Tensor], torch.Tensor], head: nn.Module) -> None:
        """Use ``embed`` (token ids -> rows) and ``head`` ([n, hidden] -> logits) as the target's."""
        self._borrowed = (embed, head)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._borrowed[0](token_ids)

    @property
    def head(self) -> nn.Module:
        """The head the draft predicts with (the target's)."""
        return self._borrowed[1]

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[..., num_features * target_hidden] concatenated target states -> context features [..., hidden]."""
        return self.hidden_norm(self.fc(aux))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[n, hidden] pre-norm block rows -> [n, vocab] float32 logits (the target's head)."""
        return norm_head_logits(self.norm, self.head, hidden)

    # ---- serving (paged KV, inside a forward_context) ----------------------------------------
    def write_context(
        self, features: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        """Write context rows' k/v into every layer's KV cache.

        features [n, hidden] (``fuse`` output), positions [n], slot_mapping [n] flat cache slots.
        The same features feed every layer (they are not transformed by earlier layers).
        """
        for layer in self.layers:
            write_kv(layer.self_attn, features, positions, slot_mapping)

    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Block rows through paged attention: token_ids, positions [n] -> [n, hidden] pre-norm.

        The forward context's metadata must make the block non-causal (a full custom mask over the
        block) with the context rows already cached before it.
        """
        h = self.embed(token_ids)
        for layer in self.layers:
            h = layer(positions, h)
        return h

    # ---- training (dense, explicit mask) -----------------------------------------------------
    def forward_dense(
        self,
        context: torch.Tensor,
        context_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Dense forward of many blocks at once.

        context [b, T, hidden] (``fuse`` output), context_positions [b, T]; block_embeds [b, Q, hidden],
        block_positions [b, Q]; mask [b, Q, T + Q] bool (True: may attend) over [context rows, block
        rows]. Returns the block rows' pre-norm output [b, Q, hidden].
        """
        b, t, _ = context.shape
        q_len = block_embeds.shape[1]
        ctx_flat, ctx_pos = context.reshape(b * t, -1), context_positions.reshape(-1)
        blk_pos = block_positions.reshape(-1)
        attn_mask = mask[:, None]  # [b, 1, Q, T + Q]
        h = block_embeds
        for layer in self.layers:
            attn = layer.self_attn
            x = layer.input_layernorm(h).reshape(b * q_len, -1)
            q = attn.query(x, blk_pos)
            k_blk, v_blk = attn.key_value(x, blk_pos)
            k_ctx, v_ctx = attn.key_value(ctx_flat, ctx_pos)

            def heads_first(
                y: torch.Tensor, n: int
            ) -> torch.Tensor:  # [b * n, h, d] -> [b, h, n, d]
                return y.view(b, n, *y.shape[1:]).transpose(1, 2)

            k = torch.cat([heads_first(k_ctx, t), heads_first(k_blk, q_len)], dim=2)
            v = torch.cat([heads_first(v_ctx, t), heads_first(v_blk, q_len)], dim=2)
            qh = heads_first(q, q_len)
            out = F.scaled_dot_product_attention(
                qh,
                k.to(qh.dtype),
                v.to(qh.dtype),
                attn_mask=attn_mask,
                scale=attn.attn.scale,
                enable_gqa=True,
            )
            h = h + attn.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return h


# ---------------------------------------------------------------------------------------------
# Loading


def tokenizer_mask_token_id(model_dir: str | Path | None) -> tuple[str, int] | None:
    """(mask token, id) declared by a HF tokenizer directory (tokenizer_config.json ``mask_token``
    resolved through tokenizer.json), or None when there is no tokenizer or no mask token."""
    if model_dir is None:
        return None
    model_dir = Path(model_dir)
    config_path, tok_path = model_dir / "tokenizer_config.json", model_dir / "tokenizer.json"
    if not config_path.is_file() or not tok_path.is_file():
        return None
    token = read_json_object(config_path).get("mask_token")
    if isinstance(token, dict):
        token = token.get("content")
    if not token:
        return None
    tok = read_json_object(tok_path)
    for added in tok.get("added_tokens", []):
        if added.get("content") == token:
            return token, int(added["id"])
    vocab = (tok.get("model") or {}).get("vocab")
    if isinstance(vocab, dict) and token in vocab:
        return token, int(vocab[token])
    return None


def dflash_block_size(draft_dir: str | Path) -> int:
    """The block size of a DFlash draft directory (a CLI can default ``num_steps`` to it minus one)."""
    path = Path(draft_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"no config.json in DFlash draft directory {str(draft_dir)!r}")
    return DFlashConfig.from_dict(read_json_object(path), str(path)).block_size


def layers_outside(target_layer_ids: tuple[int, ...], num_layers: int) -> list[int]:
    """The ids of ``target_layer_ids`` ("output of layer X") that name no layer of a ``num_layers``-layer target."""
    return [i for i in target_layer_ids if not 0 <= i < num_layers]


def _fc_problem(
    shape: tuple[int, ...], cfg: DFlashConfig, target_hidden_size: int, ids_field: str
) -> str | None:
    """What is wrong with fc.weight's ``shape`` for ``cfg``'s target layers of ``target_hidden_size`` features
    (``ids_field``: where config.json gives the target layers, named in the problem)."""
    if len(shape) != 2:
        return (
            f"fc.weight has shape {shape}: it must be 2-D [hidden_size, target layers ({ids_field}) x target "
            "hidden size]"
        )
    fc_in = shape[1]
    if fc_in % cfg.num_features or fc_in // cfg.num_features != target_hidden_size:
        return (
            f"fc.weight reads {fc_in} features = {len(cfg.target_layer_ids)} target layers ({ids_field} "
            f"{list(cfg.target_layer_ids)}) x {fc_in / cfg.num_features:g}, but the target hidden size is "
            f"{target_hidden_size}"
        )
    return None


def load_dflash_draft(
    draft_dir: str | Path, target: nn.Module, dtype: torch.dtype, device: str
) -> DFlashDraft:
    """Load a DFlash draft and check that it fits ``target``; a mismatch raises DraftMismatchError."""
    draft_dir = Path(draft_dir)
    if not (draft_dir / "config.json").is_file():
        raise ConfigError(f"no config.json in DFlash draft directory {str(draft_dir)!r}")
    path = draft_dir / "config.json"
    raw = read_json_object(path)
    cfg = DFlashConfig.from_dict(raw, str(path))
    refuse_quantization_file(draft_dir, "DFlash")
    # where config.json gives the dflash fields (dflash_config or the top level), named in the problems
    dflash = ConfigFields(raw.get("dflash_config") or {}, str(path))
    ids_field, mask_field = _where(dflash, "target_layer_ids"), _where(dflash, "mask_token_id")
    tcfg: ModelConfig = target.config
    L, vocab = tcfg.num_hidden_layers, tcfg.vocab_size
    problems = []
    if cfg.layer.vocab_size != vocab:
        problems.append(f"vocab_size {cfg.layer.vocab_size} != target vocab_size {vocab}")
    if cfg.layer.hidden_size != tcfg.hidden_size:
        problems.append(
            f"hidden_size {cfg.layer.hidden_size} != target hidden_size {tcfg.hidden_size} (the draft "
            "embeds with the target's embedding and predicts with its head)"
        )
    fc_shape = tensor_shapes(draft_dir, ("fc.weight",)).get("fc.weight")
    if fc_shape is None:  # (not config.json's doing: the weight files are named)
        raise DraftMismatchError(
            f"{weight_files_named(draft_dir)}: the DFlash draft's checkpoint has no fc.weight tensor "
            f"(the projection of the target's hidden states at {ids_field} "
            f"{list(cfg.target_layer_ids)})"
        )
    fc_problem = _fc_problem(fc_shape, cfg, tcfg.hidden_size, ids_field)
    if fc_problem is not None:
        problems.append(fc_problem)
    bad = layers_outside(cfg.target_layer_ids, L)
    if bad:
        problems.append(
            f"{ids_field} {list(cfg.target_layer_ids)} name layers {bad} that the target does not "
            f"have (ids mean 'output of layer X'; the target has {L} layers: 0 .. {L - 1})"
        )
    if cfg.layer.layer_windows:
        problems.append(
            f"its layers slide (windows {list(cfg.layer.layer_windows)}, from use_sliding_window / "
            "sliding_window / layer_types): sliding-window DFlash draft layers are not implemented"
        )
    if cfg.num_target_layers is not None and cfg.num_target_layers != L:
        problems.append(f"num_target_layers {cfg.num_target_layers} != the target's {L} layers")
    if not 0 <= cfg.mask_token_id < vocab:
        problems.append(
            f"{mask_field} {cfg.mask_token_id} is outside the target vocabulary [0, {vocab})"
        )
    else:
        declared = tokenizer_mask_token_id(getattr(target, "checkpoint_dir", None))
        if declared is not None and declared[1] != cfg.mask_token_id:
            problems.append(
                f"{mask_field} {cfg.mask_token_id} is not the target tokenizer's mask token "
                f"{declared[0]!r} (id {declared[1]})"
            )
    if problems:  # (each problem names the config.json field it contradicts)
        raise DraftMismatchError(
            f"{path}: the DFlash draft does not fit the target: " + "; ".join(problems)
        )
    # Rotary tables are computed, not learned: cover every position the target can reach.
    positions = max(cfg.layer.max_position_embeddings, tcfg.max_position_embeddings)
    cfg = dataclasses.replace(
        cfg, layer=dataclasses.replace(cfg.layer, max_position_embeddings=positions)
    )
    with default_dtype(dtype), torch.device(device):
        draft = DFlashDraft(cfg, tcfg.hidden_size)
    load_checkpoint(draft, draft_dir, progress=False)
    draft.attach_target(target)
    return draft.eval()
