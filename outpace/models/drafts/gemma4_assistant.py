"""Gemma 4 assistant drafters (Gemma4AssistantForCausalLM), as transformers 5's modeling_gemma4_assistant
defines them and its SinglePositionMultiTokenCandidateGenerator (generation/candidate_generator.py) drives
them.

One draft step reads ``[the target's embedding of a token | a hidden state]`` (2 * the target's hidden
size), projects it down (``pre_projection``), runs Gemma 4 decoder layers (models/gemma4.py) and the final
norm; the head gives the logits and ``post_projection`` the hidden state of the next step. The first step
of a draft reads the token at position L (the last token, no KV yet) and the target's hidden state at
L - 1 after its final norm (transformers' ``hidden_states[-1]``, which ``capture_outputs`` ties to the
normed last_hidden_state); the target's embedding is its scaled lookup (``get_input_embeddings``).

Every assistant layer shares KV (the config forces num_kv_shared_layers = num_hidden_layers): it has no
k/v projections and attends over the target's KV of the last layer of its type that computes its own
(transformers Gemma4TextConfig.kv_sharing_modes: "store"). Here a layer's attention is a
``TargetCacheAttention`` over that target layer's paged cache: it reads the target's keys at KV rows
0 .. L - 1 and writes nothing of its own, so the assistant needs no KV and every step of a draft sits at
the one position L (q is rotated at L). Rows L .. hold the verify's rejected drafts or nothing: they are
outside the metadata (``TargetCacheAttention``).

Sliding layers see the last sliding_window + 1 keys: the assistant's masks are transformers'
``create_bidirectional_sliding_window_mask`` (|q - kv| <= sliding_window, inclusive) flipped onto the
past, one more key than its target's causal window (kv > q - sliding_window) shows a query at L.

With ``use_ordered_embeddings`` the head scores only the tokens of the ``centroid_intermediate_top_k``
clusters whose centroids score best (``masked_embedding``: token_ordering lists the vocabulary cluster by
cluster); the others get -inf here, where transformers fills them with the batch's smallest selected
logit minus 1 (a host sync, and a value that depends on the batch): the argmax and the selected logits
are the same.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from outpace.attention.context import get_forward_context
from outpace.attention.kv_quant import dequantize
from outpace.attention.layer import Attention
from outpace.checkpoint import checkpoint_files, load_checkpoint
from outpace.distributed.group import build_group
from outpace.layers.embedding import LMHead, VocabEmbedding
from outpace.layers.linear import linear
from outpace.layers.norm import Float32RMSNorm
from outpace.model_config import ModelConfig, errors_name_file
from outpace.models.drafts.eagle3 import (
    DraftMismatchError,
    refuse_quantization_file,
    refuse_quantized,
)
from outpace.models.gemma import config_flag, layer_type, layer_type_ropes, refuse
from outpace.models.gemma4 import (
    DEFAULT_ROPE_PARAMETERS,
    ROPE_TYPES,
    Gemma4Config,
    Gemma4DecoderLayer,
    LayerShape,
    _layer_overrides,
)
from outpace.models.loader import covering_positions, default_dtype
from outpace.validation import ConfigError, ConfigFields, read_json_object

# Gemma4AssistantConfig.validate_architecture: what an assistant's text config must leave off
REQUIRED_OFF = (
    "hidden_size_per_layer_input",
    "enable_moe_block",
    "use_double_wide_mlp",
    "vocab_size_per_layer_input",
    "attention_k_eq_v",
)


class TargetCacheAttention(Attention):
    """An assistant layer's attention over one target layer's paged cache (``target``: that layer's
    ``Attention``, whose cache the engine binds). The forward's metadata puts each query at KV row
    L - 1 (the last row the target wrote), so the keys are rows 0 .. L - 1; its queries sit at position L.
    ``cached_rows`` reads the k and v of those rows, which ``forward`` then writes back unchanged (what
    every backend does first) before attending; it never writes anything else."""

    def __init__(self, target: Attention, num_heads: int, sliding_window: int | None) -> None:
        # NOTE: the window is the assistant's + 1 over the query's KV row L - 1 (rows > L - 1 - (W + 1)):
        # the last W + 1 keys, as the flipped bidirectional mask (module docstring). Comparing KV rows
        # with the row the query occupies keeps every backend's window arithmetic exact.
        super().__init__(
            num_heads,
            target.num_kv_heads,
            target.head_dim,
            None if sliding_window is None else sliding_window + 1,
            scale=1.0,
        )
        self._target = (target,)  # not a submodule: the target owns it

    @property
    def kv_cache(self):
        return self._target[0].kv_cache

    @kv_cache.setter
    def kv_cache(self, value) -> None:
        if value is not None:
            raise ValueError(
                "an assistant layer attends over the target's cache and binds none of its own"
            )

    def bind_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device):
        return self.kv_cache

    def cached_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's k and v at this forward's query rows, [num_tokens, kv_heads, head_dim] each."""
        indices = get_forward_context().metadata.slot_mapping
        return tuple(c.view(-1, *c.shape[2:]).index_select(0, indices) for c in self.kv_cache)

    def kv_scales(self):
        return self._target[0].kv_scales()  # the target's cache, read with its scales

    def forward(self, q, k, v, positions=None):
        """As ``Attention.forward``, with the window compared at the query's KV row (position - 1). Rows of
        an FP8 target cache are dequantized here; written back, they quantize to the same bytes."""
        scales = self.kv_scales()
        if scales is not None:
            k, v = dequantize(k, scales[0], q.dtype), dequantize(v, scales[1], q.dtype)
        return super().forward(q, k, v, None if positions is None else positions - 1)


@dataclasses.dataclass(frozen=True)
class AssistantConfig:
    """config.json of a Gemma4AssistantForCausalLM beyond its text config (Gemma4AssistantConfig)."""

    text: ModelConfig
    backbone_hidden_size: int
    use_ordered_embeddings: bool
    num_centroids: int
    centroid_top_k: int
    tie_word_embeddings: bool

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> AssistantConfig:
        """``raw``: the config.json object; every ``ConfigError`` names ``source`` (its path) and the field."""
        with errors_name_file(source):
            return cls._from_dict(ConfigFields(raw, source))

    @classmethod
    def _from_dict(cls, fields: ConfigFields) -> AssistantConfig:
        text_fields = fields.mapping("text_config")
        if text_fields is None:
            raise fields.fail(
                "text_config", None, "an object (the assistant's Gemma 4 text config)"
            )
        # (its layers are plain, as an EAGLE3 or DFlash draft's)
        refuse_quantized(fields, "Gemma 4 assistant")
        refuse_quantized(text_fields, "Gemma 4 assistant")
        text = dict(text_fields.data, architectures=["Gemma4ForCausalLM"])
        for key in REQUIRED_OFF:
            if text.get(key):
                raise refuse(
                    f"text_config.{key}", text[key], "0, False or absent in a Gemma 4 assistant"
                )
        if text.get("use_bidirectional_attention") == "all":
            raise refuse("text_config.use_bidirectional_attention", "all", "None or 'vision'")
        n = text_fields.integer("num_hidden_layers")
        # 0: Gemma4AssistantConfig.__post_init__ sets n
        if text_fields.integer("num_kv_shared_layers", 0, minimum=0) not in (0, n):
            raise refuse(
                "text_config.num_kv_shared_layers",
                text["num_kv_shared_layers"],
                f"num_hidden_layers = {n} (every assistant layer shares the target's KV)",
            )
        return cls(
            text=ModelConfig.from_dict(text, fields.source),
            backbone_hidden_size=fields.integer("backbone_hidden_size", 1536),
            use_ordered_embeddings=fields.boolean("use_ordered_embeddings", False),
            num_centroids=fields.integer("num_centroids", 2048),
            centroid_top_k=fields.integer("centroid_intermediate_top_k", 32),
            tie_word_embeddings=fields.boolean("tie_word_embeddings", True),
        )


def _head_dim_field(text: ModelConfig, overrides: dict[int, dict], i: int) -> str:
    """Where the assistant's config.json gives layer ``i``'s head_dim (``overrides``: ``_layer_overrides``)."""
    if "head_dim" not in overrides.get(i, {}):
        return "text_config.head_dim"
    if "per_layer_config" in text.raw:
        return f"text_config.per_layer_config.{i}.head_dim"
    return "text_config.global_head_dim"


def store_layers(target) -> dict[str, int]:
    """Layer type -> the target layer whose KV the assistant's layers of that type read: the last one of
    the type that computes its own KV (transformers Gemma4TextConfig.kv_sharing_modes' "store")."""
    cfg, shapes = target.config, target.gemma.layers
    return {
        t: max(i for i, s in enumerate(shapes) if s.producer is None and layer_type(cfg, i) == t)
        for t in {layer_type(cfg, i) for i in range(cfg.num_hidden_layers)}
    }


class OrderedHead(nn.Module):
    """transformers Gemma4AssistantMaskedEmbedder: centroid scores pick ``top_k`` clusters of
    ``vocab // num_centroids`` tokens (``token_ordering``: the vocabulary, cluster by cluster); only their
    tokens are scored against the head's rows, the others get -inf (module docstring)."""

    def __init__(self, hidden_size: int, vocab_size: int, num_centroids: int, top_k: int) -> None:
        super().__init__()
        self.top_k, self.num_centroids = top_k, num_centroids
        self.centroids = linear(hidden_size, num_centroids)
        self.register_buffer("token_ordering", torch.arange(vocab_size))  # a checkpoint tensor

    def forward(self, h: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
        """h [n, hidden] -> [n, vocab] float32 logits."""
        clusters = self.centroids(h).topk(self.top_k, dim=-1).indices  # [n, top_k]
        ids = self.token_ordering.view(self.num_centroids, -1)[clusters].flatten(
            1
        )  # [n, top_k * per_cluster]
        scores = torch.einsum("nd,nkd->nk", h, head_weight[ids]).float()
        return torch.full(
            (h.shape[0], head_weight.shape[0]), float("-inf"), device=h.device
        ).scatter_(1, ids, scores)


class Gemma4Assistant(nn.Module):
    """The assistant over a Gemma 4 target (``attach``); checkpoint names as transformers saves them."""

    def __init__(self, cfg: AssistantConfig, target) -> None:
        super().__init__()
        text, tcfg = cfg.text, target.config
        self.config = cfg
        stores = store_layers(target)
        target_layers = target.model.layers
        overrides = _layer_overrides(text)
        gemma = Gemma4Config(
            ropes=layer_type_ropes(
                text.raw.get("rope_parameters") or DEFAULT_ROPE_PARAMETERS, ROPE_TYPES
            ),
            layers=tuple(
                LayerShape(
                    head_dim=overrides.get(i, {}).get("head_dim", text.head_dim),
                    num_kv_heads=text.num_key_value_heads,
                    k_eq_v=False,
                    producer=stores[layer_type(text, i)],
                    double_wide_mlp=False,
                )
                for i in range(text.num_hidden_layers)
            ),
            final_logit_softcapping=None,
            attention_bias=config_flag(text, "attention_bias", "text_config."),
            per_layer_size=0,
            per_layer_vocab_size=0,
            moe=None,
        )
        problems = (
            [
                f"backbone_hidden_size {cfg.backbone_hidden_size} != the target's hidden_size {tcfg.hidden_size}"
            ]
            if cfg.backbone_hidden_size != tcfg.hidden_size
            else []
        )
        if text.vocab_size != tcfg.vocab_size:
            problems.append(
                f"text_config.vocab_size {text.vocab_size} != the target's {tcfg.vocab_size}"
            )
        attns = []
        for i, shape in enumerate(gemma.layers):
            t = layer_type(text, i)
            source = target_layers[shape.producer].self_attn.attn
            if (source.head_dim, source.sliding_window) != (shape.head_dim, text.layer_window(i)):
                problems.append(
                    f"layer {i} ({t}): {_head_dim_field(text, overrides, i)} {shape.head_dim}, window "
                    f"{text.layer_window(i)} (text_config.sliding_window, layer_types) against the "
                    f"target's {t} KV of head_dim {source.head_dim}, window {source.sliding_window}"
                )
            attns.append(
                TargetCacheAttention(source, text.num_attention_heads, text.layer_window(i))
            )
        if problems:  # (each problem names the config.json field it contradicts)
            raise DraftMismatchError(
                f"{text.source}: the Gemma 4 assistant does not fit the target: "
                + "; ".join(problems)
            )
        self.model = nn.Module()
        self.model.rotary = (
            nn.ModuleDict()
        )  # one table per (layer type, head_dim), not checkpoint tensors
        for i, shape in enumerate(gemma.layers):
            key = f"{layer_type(text, i)}_{shape.head_dim}"
            if key not in self.model.rotary:
                self.model.rotary[key] = gemma.ropes[layer_type(text, i)].rotary(
                    shape.head_dim, text.max_position_embeddings
                )
        self.model.layers = nn.ModuleList(
            Gemma4DecoderLayer(
                text,
                gemma,
                i,
                self.model.rotary[f"{layer_type(text, i)}_{shape.head_dim}"],
                attns[i],
            )
            for i, shape in enumerate(gemma.layers)
        )
        self.model.norm = Float32RMSNorm(text.hidden_size, text.rms_norm_eps)
        self.model.embed_tokens = VocabEmbedding(
            text.vocab_size, text.hidden_size
        )  # the tied head's rows only
        self.lm_head = LMHead(
            text.hidden_size,
            text.vocab_size,
            tied_to=self.model.embed_tokens if cfg.tie_word_embeddings else None,
        )
        self.pre_projection = linear(2 * cfg.backbone_hidden_size, text.hidden_size)
        self.post_projection = linear(text.hidden_size, cfg.backbone_hidden_size)
        if cfg.use_ordered_embeddings:
            if text.vocab_size % cfg.num_centroids:
                raise refuse(
                    "num_centroids", cfg.num_centroids, f"a divisor of vocab_size {text.vocab_size}"
                )
            self.masked_embedding = OrderedHead(
                text.hidden_size, text.vocab_size, cfg.num_centroids, cfg.centroid_top_k
            )
        self._target = (target,)
        self._kv = {
            shape.producer: attns[i] for i, shape in enumerate(gemma.layers)
        }  # target layer -> a reader

    def target_state(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's pre-norm last hidden states [n, hidden] -> the state a first step reads (normed)."""
        return self._target[0].model.norm(hidden)

    def forward(
        self, token_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: token_ids [n] (each row's token at position L), positions [n] (L), hidden [n, backbone]
        -> (logits [n, vocab] float32, the next step's hidden [n, backbone]). Under a forward context
        whose query rows are the rows' KV rows L - 1 (``TargetCacheAttention``)."""
        x = torch.cat(
            (self._target[0].embed(token_ids), hidden.to(self.pre_projection.weight.dtype)), dim=-1
        )
        h = self.pre_projection(x)
        shared = {p: attn.cached_rows() for p, attn in self._kv.items()}
        for layer in self.model.layers:
            h = layer(positions, h, None, shared)
        h = self.model.norm(h)
        if self.config.use_ordered_embeddings:
            logits = self.masked_embedding(h, self.lm_head.weight)
        else:
            logits = self.lm_head(h).float()
        return logits, self.post_projection(h)


def load_gemma4_assistant(
    draft_dir: str | Path, target, dtype: torch.dtype, device: str
) -> Gemma4Assistant:
    """Load a Gemma4AssistantForCausalLM checkpoint against a Gemma 4 ``target`` (loaded, caches bound or
    to be bound); a mismatch raises DraftMismatchError."""
    draft_dir = Path(draft_dir)
    if build_group().size > 1:
        raise ConfigError(
            "a Gemma 4 assistant drafts at tensor_parallel_size 1 only (its layers read whole target caches)"
        )
    if not hasattr(target, "gemma") or not hasattr(target.gemma, "layers"):
        raise ConfigError(
            f"a Gemma 4 assistant drafts for Gemma 4 targets, not {target.config.architecture}"
        )
    path = draft_dir / "config.json"
    cfg = AssistantConfig.from_dict(read_json_object(path), str(path))
    refuse_quantization_file(draft_dir, "Gemma 4 assistant")
    cfg = dataclasses.replace(
        cfg, text=covering_positions(cfg.text, target.config.max_position_embeddings)
    )
    checkpoint_files(draft_dir)  # every weight file checked readable before the draft is built
    # (the checks of its build, e.g. num_centroids against vocab_size, name the file too)
    with errors_name_file(str(path)), default_dtype(dtype), torch.device(device):
        draft = Gemma4Assistant(cfg, target)
    load_checkpoint(draft, draft_dir, progress=False)
    return draft.eval()
