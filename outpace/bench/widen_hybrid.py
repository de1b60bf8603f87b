"""The zoo's Qwen3.5 hybrid target (zoo/tinyqwen35: gated DeltaNet and gated attention 3:1, dense MLP,
two chained MTP layers under ``mtp.*``) widened into the Qwen3.5 shape of bench/hybrid_shape.py
(transformers' Qwen3_5TextConfig defaults: hidden 4096, 32 layers, MLP 12288; DeltaNet 16 key heads
and 32 value heads of 128; gated attention 16 heads / 4 kv heads of 256, RoPE on the first quarter),
computing the same function. Vocabulary (4096), rope_theta and partial_rotary_factor stay the zoo's.

The scaled stream (bench/widen_families.py) with e = (dk_s / dk_b) (dv_s / dv_b) (1/16 for 32 -> 128):
rms_norm_eps becomes e * eps, the stream is t = sqrt(e / r) times the zoo's, every hidden norm's output
s = 1 / sqrt(r) times. e != 1 because the gated DeltaNet's output norm shares the config's eps:

- DeltaNet heads: key head h stays h, value head j = g * ratio + m (g its key head) lands on
  g * ratio_b + m; head dims i -> i (q and k share the map, so q . k and k^T S are unchanged). in_proj_qkv
  (rows: all q, all k, all v), in_proj_z, in_proj_b, in_proj_a read the input norm (1 / s): q, k, v, z, b,
  a are the zoo's on the real heads and dims, 0 elsewhere. The depthwise conv maps channels the same
  way (padded channels: zero weights, zero output, silu(0) = 0). A_log, dt_bias: per value head.
- The delta rule: l2norm(q), l2norm(k) sum over the head's dims (zeros add nothing; eps under the
  square root of the sum, not a mean) -> the zoo's unit vectors; q is then scaled by dk_b^-0.5, which is
  sqrt(dk_s / dk_b) times the zoo's dk_s^-0.5. beta, g are the zoo's; the state S [dk, dv] holds the zoo's
  state on the real rows/columns and 0 elsewhere (k and v are 0 there), so o = q^T S is sqrt(dk_s / dk_b)
  times the zoo's on the real value dims, 0 on the padded ones.
- The gated RMSNorm over head_v_dim: mean_b(o^2) = (dk_s / dk_b)(dv_s / dv_b) mean_s = e mean_s; with
  eps_b = e eps its output is o_b / sqrt(e (mean_s + eps)) = sqrt(dv_b / dv_s) times the zoo's (the weight,
  mapped, unchanged; silu(z) the zoo's). out_proj's columns take sqrt(dv_s / dv_b), its rows t.
  Padded value heads: o = 0 -> norm 0 -> nothing.
- Gated attention (layer 3, the MTP layers): heads as widen_families.gqa_heads; head dims in the halves
  RoPE layout within the rotated quarter (pair j -> pair k j, k = d_b / d_s), unrotated dims after the
  rotated ones. q_proj's rows are [query, gate] per head: query rows times c / s, gate rows 1 / s (the
  gate is the zoo's; padded dims: attention output 0 times sigmoid(0)). q_norm/k_norm ((1 + w), eps_b =
  e eps) over d_b dims: with q = c times the zoo's, mean_b = c^2 / k mean_s; c = sqrt(e k) makes it
  e mean_s, so the norm's output is (c / sqrt(e)) = sqrt(k) times the zoo's, for q and for k. The score
  q . k / sqrt(d_b) is then k / sqrt(k) = sqrt(k) times the zoo's q . k / sqrt(d_s); Qwen3.5 has no score
  scale to set, so the norms' scale carries it: (1 + w_b) = k^(-1/4) (1 + w) for q_norm and k_norm
  (w_b = a w + a - 1, a = k^(-1/4)). That weight is the one value here not rounded from a product of
  the zoo's bf16 weight: in bf16 its (1 + w_b) is the zoo's times k^(-1/4) within ~2^-10, about the
  rounding of a bf16 activation. v and o_proj's columns: the dim map; o_proj's rows t.
- Dense MLP: gate/up read the norm (1 / s), down writes (t); units zero-padded.
- Embedding times t, untied head 1 / s. MTP: fc reads [pre_fc_norm_embedding(embedding),
  pre_fc_norm_hidden(hidden)] (two norm outputs) and writes the MTP layer's stream: t / s.
  NOTE the one inexact piece: pre_fc_norm_hidden reads the target's final-norm output (and later the MTP
  layer's own normed output: models/drafts/hybrid_mtp.py), which is at scale s, not t, so its
  eps_b = e eps is e times too small for that input: its output is the zoo's times
  sqrt((mean + eps) / (mean + e eps)), a relative change below eps (1 - e) / (2 mean) ~ 5e-7 for the
  normalised states it reads (mean square ~ 1), far below fp32 test tolerances and bf16's resolution.
- Layers past the trained ones follow Qwen3.5's pattern (every 4th full attention) and are identity:
  zero weights (zero q, k, v: l2norm(0) = 0, zero state; zero out_proj / o_proj / down_proj).
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
    Part,
    Plan,
    Stream,
    chunks,
    gqa_heads,
    halves_dims,
    identity_layer,
    prefix,
    widen_family,
    widen_zoo_pair,
    widened_config,
)


@dataclass(frozen=True)
class HybridShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int


QWEN35 = HybridShape(4096, 32, 16, 4, 256, 12288, 16, 32, 128, 128)  # bench/hybrid_shape.py
QWEN35_DRAFT = DraftShape(heads=16, kv_heads=4, head_dim=256, intermediate=12288)
# A small widening exercising every map (e = 1/4): tests, ``bench e2e --tiny``.
QWEN35_TINY = HybridShape(256, 6, 8, 2, 64, 384, 4, 8, 64, 64)
QWEN35_TINY_DRAFT = DraftShape(heads=8, kv_heads=2, head_dim=64, intermediate=384)


def _rotary_dim(cfg: dict, head_dim: int) -> int:
    """models/qwen3_next.py: int(head_dim * partial_rotary_factor)."""
    rope = cfg.get("rope_parameters") or {}
    return int(head_dim * rope.get("partial_rotary_factor", cfg.get("partial_rotary_factor", 0.25)))


def eps_factor(cfg: dict, b: HybridShape) -> float:
    """e of the module docstring: (dk_s / dk_b) (dv_s / dv_b)."""
    return cfg["linear_key_head_dim"] / b.k_dim * cfg["linear_value_head_dim"] / b.v_dim


def _axis(
    pairs: list[tuple[int, int]],
    dims: torch.Tensor,
    stride: tuple[int, int],
    size: int,
    offset: tuple[int, int] = (0, 0),
) -> Axis:
    """(small, big) head pairs whose ``len(dims)`` dims sit at head * stride + offset (small, big)."""
    dst = torch.cat([offset[1] + hb * stride[1] + dims for _, hb in pairs])
    src = torch.cat([offset[0] + hs * stride[0] + torch.arange(len(dims)) for hs, _ in pairs])
    return Axis(dst, size, src)


def _cat(*axes: Axis) -> Axis:
    return Axis(
        torch.cat([a.dst for a in axes]), axes[0].size, torch.cat([a.source() for a in axes])
    )


class _HybridWidening:
    def __init__(self, cfg: dict, small: dict, b: HybridShape, dtype: torch.dtype) -> None:
        self.cfg, self.b, self.plan = cfg, b, Plan(small, dtype)
        self.st = Stream(cfg["hidden_size"], b.hidden, eps_factor(cfg, b))
        c = cfg
        # gated attention
        d_s, d_b = c["head_dim"], b.head_dim
        self.k_att = d_b / d_s
        rot_s, rot_b = _rotary_dim(c, d_s), _rotary_dim(c, d_b)
        if rot_b != rot_s * d_b // d_s:
            raise ValueError(
                f"rotary dims {rot_s} -> {rot_b} do not scale with head_dim {d_s} -> {d_b}"
            )
        dims = halves_dims(d_s, d_b, rot_s, rot_b)
        heads = gqa_heads(c["num_attention_heads"], c["num_key_value_heads"], b.heads, b.kv_heads)
        self.query = _axis(heads.q, dims, (2 * d_s, 2 * d_b), 2 * b.heads * d_b)
        self.gate = _axis(heads.q, dims, (2 * d_s, 2 * d_b), 2 * b.heads * d_b, (d_s, d_b))
        self.q = _axis(heads.q, dims, (d_s, d_b), b.heads * d_b)
        self.kv = _axis(heads.kv, dims, (d_s, d_b), b.kv_heads * d_b)
        self.head_dims = Axis(dims, d_b)
        # gated DeltaNet
        kh, vh = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        ratio_s, ratio_b = vh // kh, b.v_heads // b.k_heads
        if kh > b.k_heads or ratio_s > ratio_b or dk > b.k_dim or dv > b.v_dim:
            raise ValueError(f"cannot widen DeltaNet {kh}/{vh} heads of {dk}/{dv} into {b}")
        k_pairs = [(h, h) for h in range(kh)]
        v_pairs = [(j, (j // ratio_s) * ratio_b + j % ratio_s) for j in range(vh)]
        kd_s, kd_b = kh * dk, b.k_heads * b.k_dim
        channels = 2 * kd_b + b.v_heads * b.v_dim
        self.qkv = _cat(
            _axis(k_pairs, torch.arange(dk), (dk, b.k_dim), channels),
            _axis(k_pairs, torch.arange(dk), (dk, b.k_dim), channels, (kd_s, kd_b)),
            _axis(v_pairs, torch.arange(dv), (dv, b.v_dim), channels, (2 * kd_s, 2 * kd_b)),
        )
        self.values = _axis(v_pairs, torch.arange(dv), (dv, b.v_dim), b.v_heads * b.v_dim)
        self.v_heads = _axis(v_pairs, torch.arange(1), (1, 1), b.v_heads)
        self.v_dims = prefix(dv, b.v_dim)

    def layer_types(self) -> list[str]:
        """The zoo's types, then Qwen3.5's pattern (every ``full_attention_interval``-th layer full)."""
        c, n = self.cfg, self.cfg["num_hidden_layers"]
        interval = c.get("full_attention_interval", 4)
        given = c.get("layer_types") or [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
        ]
        return list(given) + [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(n, self.b.layers)
        ]

    def tensor(self, name: str) -> None:
        p, st, c = self.plan, self.st, self.cfg
        H, inv_s, t = st.hidden(), 1 / st.s, st.t
        vocab = self.plan.small[name].shape[0]
        inter = prefix(c["intermediate_size"], self.b.intermediate)
        a = self.k_att**-0.25
        c_qk = math.sqrt(st.eps_factor * self.k_att)
        rules = {
            "input_layernorm.weight": ([H], 1.0),
            "post_attention_layernorm.weight": ([H], 1.0),
            "mlp.gate_proj.weight": ([inter, H], inv_s),
            "mlp.up_proj.weight": ([inter, H], inv_s),
            "mlp.down_proj.weight": ([H, inter], t),
            "self_attn.k_proj.weight": ([self.kv, H], c_qk * inv_s),
            "self_attn.v_proj.weight": ([self.kv, H], inv_s),
            "self_attn.o_proj.weight": ([H, self.q], t),
            "linear_attn.in_proj_qkv.weight": ([self.qkv, H], inv_s),
            "linear_attn.conv1d.weight": (
                [self.qkv, prefix(1, 1), prefix(*[self.plan.small[name].shape[-1]] * 2)],
                1.0,
            ),
            "linear_attn.in_proj_z.weight": ([self.values, H], inv_s),
            "linear_attn.in_proj_b.weight": ([self.v_heads, H], inv_s),
            "linear_attn.in_proj_a.weight": ([self.v_heads, H], inv_s),
            "linear_attn.A_log": ([self.v_heads], 1.0),
            "linear_attn.dt_bias": ([self.v_heads], 1.0),
            "linear_attn.norm.weight": ([self.v_dims], 1.0),
            "linear_attn.out_proj.weight": (
                [H, self.values],
                t * math.sqrt(c["linear_value_head_dim"] / self.b.v_dim),
            ),
        }
        top = {
            "model.embed_tokens.weight": ([prefix(vocab, vocab), H], t),
            "lm_head.weight": ([prefix(vocab, vocab), H], inv_s),
            "model.norm.weight": ([H], 1.0),
            "mtp.norm.weight": ([H], 1.0),
            "mtp.pre_fc_norm_embedding.weight": ([H], 1.0),
            "mtp.pre_fc_norm_hidden.weight": ([H], 1.0),
            "mtp.fc.weight": ([H, chunks(2, st.hidden_s, st.hidden_b)], t / st.s),
        }
        if name in top:
            p.put(name, name, *top[name])
            if name == "model.embed_tokens.weight" and c.get("tie_word_embeddings"):
                p.put("lm_head.weight", name, [prefix(vocab, vocab), H], inv_s)
            return
        m = re.fullmatch(r"((?:model|mtp)\.layers\.\d+\.)(.+)", name)
        if m is None:
            raise KeyError(f"widen_hybrid: no rule for tensor {name!r}")
        rest = m[2]
        if rest in rules:
            p.put(name, name, *rules[rest])
        elif rest == "self_attn.q_proj.weight":  # [query, gate] per head
            p.put(name, name, [Part([self.query, H], c_qk * inv_s), Part([self.gate, H], inv_s)])
        elif rest in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
            p.put(name, name, [Part([self.head_dims], a, a - 1)])
        else:
            raise KeyError(f"widen_hybrid: no rule for tensor {name!r}")

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
                "linear_num_key_heads": b.k_heads,
                "linear_num_value_heads": b.v_heads,
                "linear_key_head_dim": b.k_dim,
                "linear_value_head_dim": b.v_dim,
                "layer_types": self.layer_types(),
                "rms_norm_eps": c.get("rms_norm_eps", 1e-6) * self.st.eps_factor,
            },
            self.plan.dtype,
            source,
            (
                "hidden_size",
                "num_hidden_layers",
                "head_dim",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "rms_norm_eps",
            ),
        )


def widen_hybrid(
    src_dir: str | Path,
    dst_dir: str | Path,
    shape: HybridShape = QWEN35,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """zoo/tinyqwen35 (with its MTP layers) -> the same function in ``shape``."""
    return widen_family(_HybridWidening, src_dir, dst_dir, shape, dtype, max_shard_bytes)


def widen_hybrid_zoo(
    zoo_dir: str | Path,
    out_dir: str | Path,
    shape: HybridShape = QWEN35,
    draft: DraftShape = QWEN35_DRAFT,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, Path]:
    """tinyqwen35 and tinyqwen35-eagle3 widened into ``out_dir/<name>``: name -> directory."""
    return widen_zoo_pair(
        widen_hybrid,
        "tinyqwen35",
        zoo_dir,
        out_dir,
        shape,
        draft,
        dtype,
        max_shard_bytes,
        lambda cfg, _: (Stream(cfg["hidden_size"], shape.hidden, eps_factor(cfg, shape)), None),
    )
