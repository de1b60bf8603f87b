"""The zoo's DeepSeek-V3-architecture target (zoo/tinyds: MLA, sigmoid-routed MoE, 2 MTP layers) widened into
a DeepSeek-V2-Lite-like real shape, computing the same function (bench/widen_families.py: the scaled
stream, e = 1 here, so t = s = sqrt(H_b / H_s) and rms_norm_eps stays).

The shape (``V2_LITE``; DeepSeek-V2-Lite's config.json, as bench/deepseek_shape.py gives it): hidden 2048,
27 layers (the first dense, MLP 10944), 16 heads of MLA with kv_lora_rank 512, qk_nope 128, qk_rope 64,
v 128; 64 routed experts of 1408, 6 active, 2 shared. What differs from V2-Lite, and why:
- q_lora_rank 1536 (DeepSeek-V2's and V3's), where V2-Lite has one q_proj: the zoo's q_a_layernorm sits
  between its two q projections and cannot be folded into one matrix;
- routing stays the zoo's (V3: sigmoid scores, selection-only correction bias, group-limited top-k,
  normalised weights), not V2-Lite's softmax; 6 of 64 experts are active as in V2-Lite (below);
- vocabulary 4096 (the zoo's, as widen.py keeps it), RoPE unscaled (V2-Lite's YaRN would change the
  frequencies and the softmax's mscale; the zoo has none: the softmax scale is qk_head_dim^-0.5).

Pieces, small s -> big b (d = qk_nope + qk_rope, per head):
- Embedding times t, untied head times 1 / s, hidden norms unchanged (widen_families.py). The MTP
  layers' enorm, hnorm and shared_head.norm are hidden norms: hnorm reads the target's final-norm output
  (scale s) at the first step and the previous MTP layer's pre-norm output (scale t) later, which the
  same eps serves only because t = s here. eh_proj reads two norm outputs and writes the stream: t / s
  = 1. Each MTP layer's embed_tokens times t, shared_head.head times 1 / s.
- Latent norms (q_a_layernorm, kv_a_layernorm: eps fixed at 1e-6 by layers/mla.py, not the config's):
  q_a_proj's rows (and kv_a_proj_with_mqa's latent rows) are multiplied by a = sqrt(rank_b / rank_s), so
  the zero-padded latent's mean square is a^2 (rank_s / rank_b) mean_s = mean_s; with the norm weight
  divided by a the norm's output is the zoo's latent exactly (on the real dims, 0 elsewhere). The cached
  latent rows are thus the zoo's; q_b_proj and kv_b_proj read them unscaled.
- RoPE, interleaved (pairs 2j, 2j + 1; layers/rotary.py): pair j -> pair k j, k = rope_b / rope_s, the
  same frequency (widen_families.interleaved_dims). k_pe (kv_a_proj_with_mqa's last rows) is not
  normalised: those rows are only mapped (and read the input norm: 1 / s).
- Softmax scale d^-0.5: q_b_proj's rows (nope and rope parts alike) times sqrt(d_b / d_s), so
  q_b . k_b / sqrt(d_b) = q . k / sqrt(d_s); nope dims i -> i, v dims i -> i (kv_b_proj's rows, o_proj's
  columns). Absorbed (q_nope W_UK . latent) and expanded forms see the same products. Extra heads have
  zero q and zero kv_b rows: they attend uniformly to zero values and o_proj has zero columns for them.
- Dense MLPs, shared experts (one MLP of n_shared * moe_intermediate in layers/moe.py), experts:
  intermediate units zero-padded (silu(0) * 0 = 0), gate/up read the norm (1 / s), down writes (t).
- MoE routing with more active experts: each zoo expert e becomes m = top_k_b / top_k_s identical copies
  (same router row, same correction bias, same weights). Copy c of the zoo's group g is big group
  c * G_s + g (its first experts_per_group_s slots; ``expert_layout``), every other big expert is a
  padding expert with a zero router row and correction bias -1e4 (its choice score sigmoid(0) - 1e4 is
  below every real one, whose scores lie in (0, 1) plus a bias below 1 in magnitude: checked). Then: a real group's
  top-2 sum is the zoo group's (padding never among its top 2, as experts_per_group_s >= 2); the
  m * topk_group_s best groups are the m copies of the zoo's topk_group_s best (copies tie exactly); the
  top_k_b = m * top_k_s best experts in them are the m copies of each of the zoo's top_k_s; with
  norm_topk_prob each copy's weight is score_e / (m * sum of the zoo's chosen scores), so the m copies
  sum to the zoo's weighted expert output (without normalisation the copies' down_proj would take 1/m).
  Ties between distinct zoo experts or groups are broken no differently than the zoo would.
- Layers past the trained ones: zero attention and experts, post_attention_layernorm 1 and a random
  router (widen_families.py), so they add 0 while routing like real layers.
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
    heads_axis,
    identity_layer,
    interleaved_dims,
    prefix,
    widen_family,
    widen_zoo_pair,
    widened_config,
)

NEVER_CHOSEN = -1e4  # correction bias of padding experts (module docstring)


@dataclass(frozen=True)
class DeepseekShape:
    hidden: int
    layers: int
    heads: int
    q_lora_rank: int
    kv_lora_rank: int
    nope: int
    rope: int
    v: int
    intermediate: int
    moe_intermediate: int
    experts: int
    top_k: int
    shared: int


V2_LITE = DeepseekShape(2048, 27, 16, 1536, 512, 128, 64, 128, 10944, 1408, 64, 6, 2)
V2_LITE_DRAFT = DraftShape(heads=16, kv_heads=16, head_dim=128, intermediate=10944)
# A small widening exercising every map (2 copies per expert in 8 groups of 3: one padding expert per
# group): tests, ``bench e2e --tiny``.
DS_TINY = DeepseekShape(128, 5, 6, 96, 64, 32, 16, 32, 256, 96, 24, 4, 2)
DS_TINY_DRAFT = DraftShape(heads=8, kv_heads=4, head_dim=16, intermediate=256)


@dataclass(frozen=True)
class ExpertLayout:
    copies: dict[int, list[int]]  # zoo expert -> its big experts
    groups: int
    top_groups: int
    down_scale: float  # 1, or 1 / m without normalised weights


def expert_layout(cfg: dict, b: DeepseekShape) -> ExpertLayout:
    """The copies and groups of the module docstring; raises when the big shape cannot hold them."""
    e_s, g_s, k_s = cfg["n_routed_experts"], cfg.get("n_group") or 1, cfg["num_experts_per_tok"]
    per_group_s, m = e_s // g_s, b.top_k // k_s
    if b.top_k % k_s:
        raise ValueError(f"top-k {b.top_k} is not a multiple of the zoo's {k_s}")
    g_b = next(
        (
            g
            for g in range(1, b.experts + 1)
            if b.experts % g == 0 and g >= m * g_s and b.experts // g >= per_group_s
        ),
        None,
    )
    if g_b is None:
        raise ValueError(
            f"{b.experts} experts cannot hold {m} copies of {g_s} groups of {per_group_s}"
        )
    per_group_b = b.experts // g_b
    copies = {
        g * per_group_s + j: [(c * g_s + g) * per_group_b + j for c in range(m)]
        for g in range(g_s)
        for j in range(per_group_s)
    }
    normalised = cfg.get("norm_topk_prob", True)
    return ExpertLayout(copies, g_b, m * (cfg.get("topk_group") or 1), 1.0 if normalised else 1 / m)


class DeepseekWidening:
    """The plan of one widening: ``tensor(name)`` plans a zoo tensor's big counterparts (``plan.entries``),
    then ``padding_experts``, ``identity_layers`` and ``config``."""

    def __init__(self, cfg: dict, small: dict, b: DeepseekShape, dtype: torch.dtype) -> None:
        self.cfg, self.b, self.plan = cfg, b, Plan(small, dtype)
        self.st = Stream(cfg["hidden_size"], b.hidden)
        self.layout = expert_layout(cfg, b)
        s = cfg
        self.d_s, self.d_b = s["qk_nope_head_dim"] + s["qk_rope_head_dim"], b.nope + b.rope
        heads = [(h, h) for h in range(s["num_attention_heads"])]
        qk_dims = torch.cat(
            [
                torch.arange(s["qk_nope_head_dim"]),
                b.nope + interleaved_dims(s["qk_rope_head_dim"], b.rope),
            ]
        )
        self.q = heads_axis(heads, qk_dims, self.d_s, self.d_b, b.heads * self.d_b)
        kv_s, kv_b = s["qk_nope_head_dim"] + s["v_head_dim"], b.nope + b.v
        kv_dims = torch.cat(
            [torch.arange(s["qk_nope_head_dim"]), b.nope + torch.arange(s["v_head_dim"])]
        )
        self.kv_b = heads_axis(heads, kv_dims, kv_s, kv_b, b.heads * kv_b)
        self.o = heads_axis(
            heads, torch.arange(s["v_head_dim"]), s["v_head_dim"], b.v, b.heads * b.v
        )
        self.a_q = math.sqrt(b.q_lora_rank / s["q_lora_rank"])
        self.a_kv = math.sqrt(b.kv_lora_rank / s["kv_lora_rank"])

    def is_moe(self, index: int) -> bool:  # models/deepseek.py is_moe_layer
        return (
            index >= self.cfg.get("first_k_dense_replace", 0)
            and index % self.cfg.get("moe_layer_freq", 1) == 0
        )

    def big_index(self, index: int) -> int:
        """Decoder layers stay, MTP layers follow the big decoder stack."""
        n = self.cfg["num_hidden_layers"]
        return index if index < n else index - n + self.b.layers

    def tensor(self, name: str) -> None:
        p, st, b, c = self.plan, self.st, self.b, self.cfg
        H, inv_s, vocab = st.hidden(), 1 / st.s, self.plan.small[name].shape[0]
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if m is None:
            if name == "model.embed_tokens.weight":
                p.put(name, name, [prefix(vocab, vocab), H], st.t)
                if c.get("tie_word_embeddings"):
                    p.put("lm_head.weight", name, [prefix(vocab, vocab), H], inv_s)
            elif name == "lm_head.weight":
                p.put(name, name, [prefix(vocab, vocab), H], inv_s)
            elif name == "model.norm.weight":
                p.put(name, name, [H])
            else:
                raise KeyError(f"widen_deepseek: no rule for tensor {name!r}")
            return
        index, rest = int(m[1]), m[2]
        out = f"model.layers.{self.big_index(index)}.{rest}"
        rank_q, rank_kv = c["q_lora_rank"], c["kv_lora_rank"]
        inter = prefix(c["intermediate_size"], b.intermediate)
        moe_inter = prefix(c["moe_intermediate_size"], b.moe_intermediate)
        shared = prefix(
            c["moe_intermediate_size"] * c.get("n_shared_experts", 0), b.moe_intermediate * b.shared
        )
        rules = {
            "input_layernorm.weight": ([H], 1.0),
            "post_attention_layernorm.weight": ([H], 1.0),
            "enorm.weight": ([H], 1.0),
            "hnorm.weight": ([H], 1.0),
            "shared_head.norm.weight": ([H], 1.0),
            "eh_proj.weight": ([H, chunks(2, st.hidden_s, st.hidden_b)], st.t / st.s),
            "embed_tokens.weight": ([prefix(vocab, vocab), H], st.t),
            "shared_head.head.weight": ([prefix(vocab, vocab), H], inv_s),
            "self_attn.q_a_proj.weight": ([prefix(rank_q, b.q_lora_rank), H], self.a_q * inv_s),
            "self_attn.q_a_layernorm.weight": ([prefix(rank_q, b.q_lora_rank)], 1 / self.a_q),
            "self_attn.q_b_proj.weight": (
                [self.q, prefix(rank_q, b.q_lora_rank)],
                math.sqrt(self.d_b / self.d_s),
            ),
            "self_attn.kv_a_layernorm.weight": ([prefix(rank_kv, b.kv_lora_rank)], 1 / self.a_kv),
            "self_attn.kv_b_proj.weight": ([self.kv_b, prefix(rank_kv, b.kv_lora_rank)], 1.0),
            "self_attn.o_proj.weight": ([H, self.o], st.t),
            "mlp.gate_proj.weight": ([inter, H], inv_s),
            "mlp.up_proj.weight": ([inter, H], inv_s),
            "mlp.down_proj.weight": ([H, inter], st.t),
            "mlp.shared_experts.gate_proj.weight": ([shared, H], inv_s),
            "mlp.shared_experts.up_proj.weight": ([shared, H], inv_s),
            "mlp.shared_experts.down_proj.weight": ([H, shared], st.t),
        }
        if rest in rules:
            axes, scale = rules[rest]
            p.put(out, name, axes, scale)
        elif rest == "self_attn.kv_a_proj_with_mqa.weight":  # [latent; k_pe] rows
            rope_s = c["qk_rope_head_dim"]
            latent = Part([prefix(rank_kv, b.kv_lora_rank + b.rope), H], self.a_kv * inv_s)
            rows = Axis(
                b.kv_lora_rank + interleaved_dims(rope_s, b.rope),
                b.kv_lora_rank + b.rope,
                rank_kv + torch.arange(rope_s),
            )
            p.put(out, name, [latent, Part([rows, H], inv_s)])
        elif rest in ("mlp.gate.weight", "mlp.gate.e_score_correction_bias"):
            e_s = c["n_routed_experts"]
            src = torch.tensor([e for e in range(e_s) for _ in self.layout.copies[e]])
            dst = torch.tensor([x for e in range(e_s) for x in self.layout.copies[e]])
            rows = Axis(dst, b.experts, src)
            if rest == "mlp.gate.weight":  # the router stays float32 (layers/router.py Router)
                p.put(out, name, [rows, H], inv_s, dtype=torch.float32)
            else:
                if p.small[name].abs().max() >= 1:
                    raise ValueError(
                        f"{name}: a correction bias of 1 or more could tie padding experts"
                    )
                p.put(out, name, [rows], fill=NEVER_CHOSEN, dtype=torch.float32)
        elif (e := re.fullmatch(r"mlp\.experts\.(\d+)\.(\w+)\.weight", rest)) is not None:
            e_s, proj = int(e[1]), e[2]
            pre = out.removesuffix(rest)
            for big in self.layout.copies[e_s]:
                target = f"{pre}mlp.experts.{big}.{proj}.weight"
                if proj == "down_proj":
                    p.put(target, name, [H, moe_inter], st.t * self.layout.down_scale)
                else:
                    p.put(target, name, [moe_inter, H], inv_s)
        else:
            raise KeyError(f"widen_deepseek: no rule for tensor {name!r}")

    def padding_experts(self, layer: int) -> None:
        """Zero experts at the big indices no zoo expert's copy holds."""
        held = {x for xs in self.layout.copies.values() for x in xs}
        b = self.b
        for e in sorted(set(range(b.experts)) - held):
            for proj, shape in (
                ("gate_proj", (b.moe_intermediate, b.hidden)),
                ("up_proj", (b.moe_intermediate, b.hidden)),
                ("down_proj", (b.hidden, b.moe_intermediate)),
            ):
                self.plan.zeros(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", shape)

    def identity_layers(self) -> None:
        """Layers n_s .. layers_b - 1: zero, a random router on MoE layers (module docstring)."""
        n, b = self.cfg["num_hidden_layers"], self.b
        for i in range(n, b.layers):
            template = next(j for j in range(n) if self.is_moe(j) == self.is_moe(i))
            builders = {}
            if self.is_moe(i):
                shape = (b.experts, b.hidden)

                def router(
                    seed: int = i,
                ) -> torch.Tensor:  # [experts, hidden] float32, logits ~ N(0, 1)
                    g = torch.Generator().manual_seed(seed)
                    return torch.randn(shape, generator=g) / math.sqrt(shape[1])

                builders["mlp.gate.weight"] = router
            identity_layer(
                self.plan,
                f"model.layers.{template}.",
                i,
                {"post_attention_layernorm.weight": 1.0},
                builders,
            )

    def config(self, source: str) -> dict:
        c, b, lay = self.cfg, self.b, self.layout
        return widened_config(
            c,
            {
                "hidden_size": b.hidden,
                "num_hidden_layers": b.layers,
                "intermediate_size": b.intermediate,
                "moe_intermediate_size": b.moe_intermediate,
                "num_attention_heads": b.heads,
                "num_key_value_heads": b.heads,
                "q_lora_rank": b.q_lora_rank,
                "kv_lora_rank": b.kv_lora_rank,
                "qk_nope_head_dim": b.nope,
                "qk_rope_head_dim": b.rope,
                "v_head_dim": b.v,
                "qk_head_dim": b.nope + b.rope,
                "head_dim": b.rope,
                "n_routed_experts": b.experts,
                "num_experts_per_tok": b.top_k,
                "n_shared_experts": b.shared,
                "n_group": lay.groups,
                "topk_group": lay.top_groups,
            },
            self.plan.dtype,
            source,
            (
                "hidden_size",
                "num_hidden_layers",
                "num_attention_heads",
                "q_lora_rank",
                "kv_lora_rank",
                "n_routed_experts",
                "num_experts_per_tok",
                "n_group",
                "topk_group",
                "moe_intermediate_size",
            ),
            routing=f"each zoo expert served by {b.top_k // c['num_experts_per_tok']} identical copies: "
            f"{b.top_k} of {b.experts} experts active as in the real shape, the zoo's routing function",
        )


def _pad_moe_layers(w: DeepseekWidening, small: dict) -> None:
    """Padding experts in every widened MoE layer (after the zoo's tensors, before identity layers)."""
    moe_layers = set()
    for name in small:
        if (m := re.fullmatch(r"model\.layers\.(\d+)\.mlp\.gate\.weight", name)) is not None:
            moe_layers.add(w.big_index(int(m[1])))
    for layer in sorted(moe_layers):
        w.padding_experts(layer)


def widen_deepseek(
    src_dir: str | Path,
    dst_dir: str | Path,
    shape: DeepseekShape = V2_LITE,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """zoo/tinyds (with its MTP layers) -> the same function in ``shape``."""
    return widen_family(
        DeepseekWidening, src_dir, dst_dir, shape, dtype, max_shard_bytes, _pad_moe_layers
    )


def widen_deepseek_zoo(
    zoo_dir: str | Path,
    out_dir: str | Path,
    shape: DeepseekShape = V2_LITE,
    draft: DraftShape = V2_LITE_DRAFT,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, Path]:
    """tinyds and tinyds-eagle3 widened into ``out_dir/<name>``: name -> directory."""
    return widen_zoo_pair(
        widen_deepseek,
        "tinyds",
        zoo_dir,
        out_dir,
        shape,
        draft,
        dtype,
        max_shard_bytes,
        lambda cfg, _: (Stream(cfg["hidden_size"], shape.hidden), None),
    )
