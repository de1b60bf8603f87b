"""The zoo's Gemma 3 target (zoo/tinygemma: 6 layers, every 3rd full, the others sliding over 128 tokens)
widened into Gemma-3-12B's shape (google/gemma-3-12b-pt's text config: hidden 3840, 48 layers, 16 heads /
8 kv heads of 256, MLP 15360, 5 sliding layers per full one), computing the same function. Vocabulary
(4096), the sliding window (128, not 12B's 1024: the trained layers' attention depends on it) and the
RoPE parameters per layer type stay the zoo's.

The scaled stream (bench/widen_families.py) with e = 1: rms_norm_eps stays, the stream and every hidden
norm's output are s = sqrt(H_b / H_s) times the zoo's (sqrt(30) for 128 -> 3840).

- (1 + w) norms: the proof in widen_families.py holds for any per-dim scale, (1 + w) included: the
  weights stay as they are (no -1 padding is needed: on the padded dims x = 0, so the output is 0
  whatever the weight).
- The embedding: Gemma multiplies the looked-up rows by sqrt(hidden) rounded to the weights' dtype
  (layers/embedding.py ScaledVocabEmbedding). The stream must be s times the zoo's:
  E_b round(sqrt(H_b)) = s E round(sqrt(H_s)), so E_b = E * s round(sqrt(H_s)) / round(sqrt(H_b)) (1 up to
  the two roundings). The head is untied and reads the final norm: E / s.
- Sandwich norms: input_layernorm and pre_feedforward_layernorm read the stream (t = s);
  post_attention_layernorm reads o_proj's output and post_feedforward_layernorm down_proj's, so those
  write at scale s (rows times s), and the post norms' outputs, s times the zoo's, are what is added to
  the stream. Readers of norm outputs (q/k/v, gate/up) take 1 / s.
- q_norm/k_norm ((1 + w) over head_dim, the same eps): head dims in the halves RoPE layout (pair j ->
  pair k j, k = d_b / d_s, the same frequency: widen.py). q and k rows take c = sqrt(k) (times 1 / s), so
  the zero-padded head's mean square is c^2 / k mean_s = mean_s: each norm's output is sqrt(k) times the
  zoo's (weights unchanged). The score is then k times the zoo's q . k; Gemma scales scores by
  query_pre_attn_scalar^-0.5, so query_pre_attn_scalar_b = k^2 query_pre_attn_scalar_s makes the
  softmax's input the zoo's exactly (a config value: the attention costs the same).
- GQA: tinygemma has 4 q heads per kv head, Gemma-3-12B 2: each kv head is copied (widen_families.py
  gqa_heads), identical k and v rows.
- Soft-capping: the logits are the zoo's, so final_logit_softcapping (null in the zoo) caps them alike;
  attention logit softcapping is refused by models/gemma.py.
- GELU-tanh MLP: the gate is the zoo's exactly (1 / s on its columns), down_proj's rows s.
- Layers past the trained ones: zero weights (zero q, k, v, o_proj, MLP), their types continue the
  every-6th-full pattern; a (1 + 0) post norm of a zero input is 0, so they add nothing.
- The EAGLE3 draft reads the target's raw table times its ``embed_scale`` (models/drafts/eagle3.py,
  sqrt(hidden) for Gemma targets): the widened draft's config sets embed_scale = s sqrt(H_s) E / E_b, so
  it reads s times the zoo's scaled embedding, the scale of its stream.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from outpace.bench.widen import MAX_SHARD_BYTES
from outpace.bench.widen_families import (
    Axis,
    DraftShape,
    Plan,
    Stream,
    gqa_heads,
    halves_dims,
    heads_axis,
    identity_layer,
    prefix,
    widen_family,
    widen_zoo_pair,
    widened_config,
)
from outpace.models.drafts.eagle3 import _embed_scale


@dataclass(frozen=True)
class GemmaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


GEMMA3_12B = GemmaShape(3840, 48, 16, 8, 256, 15360)
GEMMA3_12B_DRAFT = DraftShape(heads=16, kv_heads=8, head_dim=256, intermediate=15360)
# A small widening exercising every map (kv heads copied, 4 -> 2 q heads per kv head): tests, ``--tiny``.
GEMMA_TINY = GemmaShape(320, 8, 4, 2, 64, 384)
GEMMA_TINY_DRAFT = DraftShape(heads=4, kv_heads=2, head_dim=64, intermediate=384)
PATTERN = 6  # Gemma 3: every 6th layer full (sliding_window_pattern)


def embed_factor(hidden_s: int, hidden_b: int, dtype: torch.dtype) -> float:
    """E_b / E (module docstring): s round(sqrt(H_s)) / round(sqrt(H_b)), rounded as the model rounds."""
    rounded = lambda h: torch.tensor(h**0.5, dtype=dtype).item()  # noqa: E731
    return math.sqrt(hidden_b / hidden_s) * rounded(hidden_s) / rounded(hidden_b)


class _GemmaWidening:
    def __init__(self, cfg: dict, small: dict, b: GemmaShape, dtype: torch.dtype) -> None:
        self.cfg, self.b, self.plan = cfg, b, Plan(small, dtype)
        self.st = Stream(cfg["hidden_size"], b.hidden)
        d_s = cfg["head_dim"]
        self.k = b.head_dim // d_s  # halves_dims refuses a non-multiple
        dims = halves_dims(d_s, b.head_dim)
        heads = gqa_heads(
            cfg["num_attention_heads"], cfg["num_key_value_heads"], b.heads, b.kv_heads
        )
        self.q = heads_axis(heads.q, dims, d_s, b.head_dim, b.heads * b.head_dim)
        self.kv = heads_axis(heads.kv, dims, d_s, b.head_dim, b.kv_heads * b.head_dim)
        self.head_dims = Axis(dims, b.head_dim)

    def layer_types(self) -> list[str]:
        n = self.cfg["num_hidden_layers"]
        pattern = self.cfg.get("sliding_window_pattern", PATTERN)
        given = self.cfg.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)
        ]
        return list(given) + [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(n, self.b.layers)
        ]

    def tensor(self, name: str) -> None:
        p, st, c = self.plan, self.st, self.cfg
        H, inv_s, s = st.hidden(), 1 / st.s, st.s
        vocab = p.small[name].shape[0]
        inter = prefix(c["intermediate_size"], self.b.intermediate)
        qk = math.sqrt(self.k) * inv_s
        rules = {
            **{
                f"{n}.weight": ([H], 1.0)
                for n in (
                    "input_layernorm",
                    "post_attention_layernorm",
                    "pre_feedforward_layernorm",
                    "post_feedforward_layernorm",
                )
            },
            "self_attn.q_proj.weight": ([self.q, H], qk),
            "self_attn.k_proj.weight": ([self.kv, H], qk),
            "self_attn.v_proj.weight": ([self.kv, H], inv_s),
            "self_attn.o_proj.weight": ([H, self.q], s),
            "self_attn.q_norm.weight": ([self.head_dims], 1.0),
            "self_attn.k_norm.weight": ([self.head_dims], 1.0),
            "mlp.gate_proj.weight": ([inter, H], inv_s),
            "mlp.up_proj.weight": ([inter, H], inv_s),
            "mlp.down_proj.weight": ([H, inter], s),
        }
        if name == "model.embed_tokens.weight":
            p.put(
                name,
                name,
                [prefix(vocab, vocab), H],
                embed_factor(st.hidden_s, st.hidden_b, p.dtype),
            )
            if c.get("tie_word_embeddings", True):
                p.put("lm_head.weight", name, [prefix(vocab, vocab), H], inv_s)
        elif name == "lm_head.weight":
            p.put(name, name, [prefix(vocab, vocab), H], inv_s)
        elif name == "model.norm.weight":
            p.put(name, name, [H])
        elif (m := re.fullmatch(r"model\.layers\.\d+\.(.+)", name)) is not None and m[1] in rules:
            p.put(name, name, *rules[m[1]])
        else:
            raise KeyError(f"widen_gemma: no rule for tensor {name!r}")

    def identity_layers(self) -> None:
        n, types = self.cfg["num_hidden_layers"], self.layer_types()
        for i in range(n, self.b.layers):
            template = next(j for j in range(n) if types[j] == types[i])
            identity_layer(self.plan, f"model.layers.{template}.", i)

    def config(self, source: str) -> dict:
        c, b = self.cfg, self.b
        return widened_config(
            c,
            {
                "hidden_size": b.hidden,
                "num_hidden_layers": b.layers,
                "intermediate_size": b.intermediate,
                "num_attention_heads": b.heads,
                "num_key_value_heads": b.kv_heads,
                "head_dim": b.head_dim,
                "query_pre_attn_scalar": c.get("query_pre_attn_scalar", 256)
                * self.k**2,  # an int stays one
                "layer_types": self.layer_types(),
            },
            self.plan.dtype,
            source,
            (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "query_pre_attn_scalar",
            ),
        )


def widen_gemma(
    src_dir: str | Path,
    dst_dir: str | Path,
    shape: GemmaShape = GEMMA3_12B,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """zoo/tinygemma -> the same function in ``shape``."""
    return widen_family(_GemmaWidening, src_dir, dst_dir, shape, dtype, max_shard_bytes)


def widen_gemma_zoo(
    zoo_dir: str | Path,
    out_dir: str | Path,
    shape: GemmaShape = GEMMA3_12B,
    draft: DraftShape = GEMMA3_12B_DRAFT,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, Path]:
    """tinygemma and tinygemma-eagle3 widened into ``out_dir/<name>``: name -> directory."""

    def draft_stream(cfg: dict, draft_cfg: dict) -> tuple[Stream, float]:
        hs = cfg["hidden_size"]
        scale = (
            math.sqrt(shape.hidden / hs)
            * _embed_scale(draft_cfg)
            / embed_factor(hs, shape.hidden, dtype)
        )
        return Stream(hs, shape.hidden), scale

    return widen_zoo_pair(
        widen_gemma,
        "tinygemma",
        zoo_dir,
        out_dir,
        shape,
        draft,
        dtype,
        max_shard_bytes,
        draft_stream,
    )
