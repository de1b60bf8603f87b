"""Widening the zoo's DeepSeek, Qwen3.5 and Gemma targets and their EAGLE3 drafts into real shapes
(issue 43 item 6): what the three families share. The per-family maps and their proofs are in
widen_deepseek.py (MLA + MoE), widen_hybrid.py (gated DeltaNet + gated attention) and widen_gemma.py
(sandwich norms, (1 + w) norms, scaled embedding). The Llama widening is widen.py: its RoPE pair map
(``halves_dims`` here, generalised to partial rotation) and its streaming writer are the ones used here.

The scaled stream. widen.py keeps the residual stream's values and fixes each norm with eps * r and
w * sqrt(r) (r = H_s / H_b). That fails for (1 + w) norms (Gemma's, Qwen3.5's: w_b = sqrt(r)(1 + w) - 1
loses the weight's precision in bf16) and when one eps must serve norms of different widths. Here
every hidden-width vector (the stream, each norm's input and output, the EAGLE3 draft's stream) is
instead carried *scaled* on the real dims, zeros on the padded ones:

- the stream (and every hidden norm's input) is t times the zoo's; the config's rms_norm_eps is
  eps_b = e * eps with e = t^2 * r (e = 1 unless a family needs otherwise: widen_hybrid.py);
- an RMSNorm of such an input (mean over H_b dims, the padded ones 0: mean_b = t^2 r mean_s), plain
  (w x) or (1 + w) x, with its weight unchanged: w t x / sqrt(t^2 r mean_s + t^2 r eps) = (1 / sqrt(r)) *
  the zoo's output, so every hidden norm's output is s = 1 / sqrt(r) times the zoo's, whatever t;
- so a matrix that reads a norm output has its input columns times 1 / s, a matrix that writes the
  stream (o_proj, down_proj, out_proj, the embedding) its output rows times t, and a matrix that reads
  and writes hidden-width vectors of the same scale (MTP eh_proj reading two norm outputs and writing
  the stream: t / s; EAGLE3 fc reading the target's stream and writing its own: 1) the ratio;
- a tied head reads a norm output (1 / s) while the embedding writes the stream (t): the widened
  checkpoints untie them (``lm_head.weight`` written, ``tie_word_embeddings`` false).

Each scale is one float64 product rounded once to the output dtype: exact in real arithmetic, last-bit
differences in fp32, and in bf16 the weights are the zoo's bf16 values re-rounded once (s is
irrational unless H_b / H_s is a power of 4), so greedy tokens can part only at near ties.

Layers added past the trained ones are identity: a layer whose stream-writing matrices (o_proj,
down_proj, out_proj, the experts' down_proj) are zero adds exactly 0 (their other weights cost what
real ones cost). MoE layers get a random router there (widen_deepseek.py), so tokens spread over the
experts as real routing does and the experts a batch reads are not artificially few.

Heads. ``gqa_heads`` maps query and key/value heads as widen.py does (small kv head g stays g, small
q head g * group_s + m lands on big q head g * group_b + m) and, when the big group is smaller than the
small one (tinygemma's 4 q heads per kv head into Gemma-3-12B's 2), copies each small kv head into
ceil(group_s / group_b) big kv heads, the small group's q heads spread over the copies: identical keys
and values, so each q head attends exactly as before.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file

from outpace.bench.widen import MAX_SHARD_BYTES, Entry, copy_tokenizer, write_checkpoint


@dataclass(frozen=True)
class Axis:
    """One axis of a widened tensor: small index ``src[i]`` lands on big index ``dst[i]`` of ``size``."""

    dst: torch.Tensor  # [n]
    size: int
    src: torch.Tensor | None = None  # [n]; None: 0 .. n - 1

    def source(self) -> torch.Tensor:
        return torch.arange(len(self.dst)) if self.src is None else self.src


def prefix(n: int, size: int) -> Axis:
    """Small index i -> big index i (hidden dims, intermediate units, latent dims)."""
    return Axis(torch.arange(n), size)


def chunks(n: int, small: int, big: int) -> Axis:
    """Concatenated inputs: column c * small + i -> c * big + i."""
    return Axis(torch.cat([c * big + torch.arange(small) for c in range(n)]), n * big)


def halves_dims(
    d_s: int, d_b: int, rot_s: int | None = None, rot_b: int | None = None
) -> torch.Tensor:
    """[d_s] -> big head dim of each small head dim, RoPE in the halves layout over the first ``rot``
    dims (all by default): rotated pair j (dims j, j + rot/2) -> pair k * j, k = rot_b / rot_s, whose
    frequency theta^(-2kj / rot_b) = theta^(-2j / rot_s) is the same float (widen.py); the unrotated
    dims rot_s + i -> rot_b + i."""
    rot_s, rot_b = rot_s or d_s, rot_b or d_b
    k, half = rot_b // rot_s, rot_s // 2
    assert rot_b % rot_s == 0 and rot_s % 2 == 0 and d_b - rot_b >= d_s - rot_s, (
        d_s,
        d_b,
        rot_s,
        rot_b,
    )
    j = torch.arange(half)
    return torch.cat([k * j, rot_b // 2 + k * j, rot_b + torch.arange(d_s - rot_s)])


def interleaved_dims(d_s: int, d_b: int) -> torch.Tensor:
    """[d_s] -> big dims, RoPE in DeepSeek's interleaved layout (pairs 2j, 2j + 1, frequency index j):
    pair j -> pair k * j, k = d_b / d_s (the same frequency, as ``halves_dims``)."""
    k = d_b // d_s
    assert d_b % d_s == 0 and d_s % 2 == 0, (d_s, d_b)
    j = torch.arange(d_s // 2)
    return torch.stack([2 * k * j, 2 * k * j + 1], dim=1).reshape(-1)


def heads_axis(
    pairs: list[tuple[int, int]], dims: torch.Tensor, d_s: int, d_b: int, size: int
) -> Axis:
    """(small head, big head) pairs and the per-head dim map -> the axis over heads * head_dim."""
    dst = torch.cat([h_b * d_b + dims for _, h_b in pairs])
    src = torch.cat([h_s * d_s + torch.arange(d_s) for h_s, _ in pairs])
    return Axis(dst, size, src)


@dataclass(frozen=True)
class GqaHeads:
    """(small head, big head) pairs for query heads and for key/value heads (copies included)."""

    q: list[tuple[int, int]]
    kv: list[tuple[int, int]]


def gqa_heads(heads_s: int, kv_s: int, heads_b: int, kv_b: int) -> GqaHeads:
    """The module docstring's head map; raises when the big shape has too few heads."""
    gs, gb = heads_s // kv_s, heads_b // kv_b
    copies = -(-gs // gb)  # big kv heads per small kv head
    if kv_s * copies > kv_b or heads_b % kv_b:
        raise ValueError(f"cannot place {heads_s}/{kv_s} heads into {heads_b}/{kv_b}")
    q = []
    for h in range(heads_s):
        g, m = divmod(h, gs)
        kv = g * copies + m // gb
        q.append((h, kv * gb + m % gb))
    kv = [(g, g * copies + c) for g in range(kv_s) for c in range(copies)]
    return GqaHeads(q, kv)


@dataclass(frozen=True)
class Part:
    """Small values ``small[src]`` * scale + offset written at ``dst`` of a big tensor."""

    axes: list[Axis]
    scale: float = 1.0
    offset: float = 0.0


def _place(out: torch.Tensor, dst: list[torch.Tensor], value: torch.Tensor, axis: int = 0) -> None:
    """out[dst[0] x dst[1] x ...] = value, one axis at a time (index_copy: no advanced indexing, whose
    parallel loop is slow on a busy CPU)."""
    if axis == len(dst) - 1:
        out.index_copy_(axis, dst[axis], value)
        return
    rows = out.index_select(axis, dst[axis])
    _place(rows, dst, value, axis + 1)
    out.index_copy_(axis, dst[axis], rows)


@dataclass
class Plan:
    """The widened checkpoint being described: entries built lazily from the small tensors."""

    small: dict[str, torch.Tensor]
    dtype: torch.dtype
    entries: list[Entry] = field(default_factory=list)

    def put(
        self,
        name: str,
        source: str,
        parts: list[Part] | list[Axis],
        scale: float = 1.0,
        fill: float = 0.0,
        dtype: torch.dtype | None = None,
    ) -> None:
        """Big tensor ``name`` from small tensor ``source``: zeros (or ``fill``) with each part written in.
        ``parts`` may be the axes of a single part of ``scale``."""
        if parts and isinstance(parts[0], Axis):
            parts = [Part(parts, scale)]
        t = self.small[source]
        dtype = dtype or (self.dtype if t.is_floating_point() else t.dtype)
        shape = tuple(a.size for a in parts[0].axes)

        def build() -> torch.Tensor:
            out = torch.full(shape, fill, dtype=dtype)
            for p in parts:
                value = t.double() if t.is_floating_point() else t
                for i, a in enumerate(p.axes):
                    value = value.index_select(i, a.source())
                if t.is_floating_point():
                    value = value * p.scale + p.offset  # rounded once, below
                _place(out, [a.dst for a in p.axes], value.to(dtype))
            return out

        self.entries.append((name, shape, dtype, build))

    def add(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        build: Callable[[], torch.Tensor],
    ) -> None:
        self.entries.append((name, shape, dtype, build))

    def zeros(self, name: str, shape: tuple[int, ...]) -> None:
        dtype = self.dtype
        self.entries.append((name, shape, dtype, lambda: torch.zeros(shape, dtype=dtype)))

    def like(self, prefix_: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Suffix -> (big shape, dtype) of the entries named ``prefix_ + suffix`` so far."""
        return {
            n.removeprefix(prefix_): (s, d) for n, s, d, _ in self.entries if n.startswith(prefix_)
        }


def load_small(src: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A zoo directory's config and tensors (one safetensors file)."""
    cfg = json.loads((src / "config.json").read_text())
    return cfg, load_file(str(src / "model.safetensors"))


def identity_layer(
    plan: Plan,
    template: str,
    index: int,
    fills: dict[str, float] | None = None,
    builders: dict[str, Callable[[], torch.Tensor]] | None = None,
) -> None:
    """Layer ``index``: the tensors of the already planned layer prefix ``template`` (shapes and dtypes),
    all zero except the suffixes in ``fills`` (a constant) and ``builders`` (built by the callable)."""
    for suffix, (shape, dtype) in plan.like(template).items():
        value = (fills or {}).get(suffix, 0.0)
        build = (builders or {}).get(suffix) or (
            lambda s=shape, d=dtype, v=value: torch.full(s, v, dtype=d)
        )
        plan.add(f"model.layers.{index}.{suffix}", shape, dtype, build)


def write_widened(
    plan: Plan, cfg: dict, src: Path, dst: Path, max_shard_bytes: int = MAX_SHARD_BYTES
) -> Path:
    """The planned tensors as safetensors shards, the config and the tokenizer files."""
    dst.mkdir(parents=True, exist_ok=True)
    write_checkpoint(dst, plan.entries, max_shard_bytes, desc=f"widening {src.name}")
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    copy_tokenizer(src, dst)
    return dst


def widen_family(
    widening: Callable[[dict, dict, object, torch.dtype], object],
    src_dir: str | Path,
    dst_dir: str | Path,
    shape: object,
    dtype: torch.dtype,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    before_identity: Callable[[object, dict[str, torch.Tensor]], None] | None = None,
) -> Path:
    """The load / plan / write sequence of each family's ``widen_<family>``: ``widening(cfg, small,
    shape, dtype)`` plans every zoo tensor (``tensor``), then ``before_identity(w, small)`` (if any),
    then the identity layers; its ``plan`` and ``config`` are written to ``dst_dir``."""
    src = Path(src_dir)
    cfg, small = load_small(src)
    w = widening(cfg, small, shape, dtype)
    for name in small:
        w.tensor(name)
    if before_identity is not None:
        before_identity(w, small)
    w.identity_layers()
    return write_widened(w.plan, w.config(src.name), src, Path(dst_dir), max_shard_bytes)


def widened_config(
    cfg: dict, big: dict, dtype: torch.dtype, source: str, kept: tuple[str, ...], **extra: str
) -> dict:
    """A family's widened config: the zoo's ``cfg`` with the ``big`` fields, untied (module docstring),
    in ``dtype``; ``widened_from`` holds the zoo's ``kept`` fields and ``extra``."""
    return dtype_config(
        {**cfg, **big, "tie_word_embeddings": False},
        dtype,
        source,
        {k: cfg.get(k) for k in kept} | extra,
    )


def dtype_config(cfg: dict, dtype: torch.dtype, source: str, small: dict) -> dict:
    """The output dtype and provenance fields of a widened config."""
    name = str(dtype).removeprefix("torch.")
    out = {**cfg, "torch_dtype": name, "widened_from": {"checkpoint": source, **small}}
    if "dtype" in cfg:  # transformers >= 5 writes both
        out["dtype"] = name
    return out


# ---- EAGLE3 drafts: one Llama decoder layer over the target's states (models/drafts/eagle3.py) ----


@dataclass(frozen=True)
class DraftShape:
    """A widened EAGLE3 draft's layer: its hidden size is the widened target's."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


@dataclass(frozen=True)
class Stream:
    """The scaled stream of the module docstring: hidden sizes (small, big) and the eps factor e."""

    hidden_s: int
    hidden_b: int
    eps_factor: float = 1.0

    @property
    def s(self) -> float:
        """Every hidden norm's output, over the zoo's: 1 / sqrt(r)."""
        return math.sqrt(self.hidden_b / self.hidden_s)

    @property
    def t(self) -> float:
        """The stream over the zoo's: sqrt(e / r)."""
        return math.sqrt(self.eps_factor) * self.s

    def hidden(self) -> Axis:
        return prefix(self.hidden_s, self.hidden_b)


def widen_eagle3(
    src: Path,
    dst: Path,
    stream: Stream,
    shape: DraftShape,
    dtype: torch.dtype,
    embed_scale: float | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """An EAGLE3 draft of a zoo target -> the same draft for the target widened with ``stream``.

    Its width is the target's and its stream is the target's scale t (``fc`` reads the target's stream
    and writes its own: unscaled), its norms take eps * e, q/k/v and gate/up read norm outputs (1 / s),
    o_proj and down_proj write the stream (t), the head reads the final norm (1 / s). Attention is a
    Llama layer's (head_dim^-0.5, no q/k norms, RoPE in halves over the whole head): q rows times
    sqrt(d_b / d_s) (widen.py). ``embed_scale``: what the widened draft must multiply the widened
    target's table by (Gemma targets: widen_gemma.py); d2t, t2d, aux ids and the vocabulary stay."""
    cfg, small = load_small(src)
    hs, d_s = (
        cfg["hidden_size"],
        cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"],
    )
    if cfg.get("target_hidden_size", hs) != hs or stream.hidden_s != hs:
        raise ValueError(f"{src}: the draft's width must be its target's ({stream.hidden_s})")
    if any(n.startswith("embed_tokens") or "fc_norm" in n for n in small):
        raise ValueError(f"{src}: drafts with their own embedding or aux norms are not widened")
    plan, hb, st = Plan(small, dtype), stream.hidden_b, stream
    heads = gqa_heads(
        cfg["num_attention_heads"],
        cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
        shape.heads,
        shape.kv_heads,
    )
    dims = halves_dims(d_s, shape.head_dim)
    q = heads_axis(heads.q, dims, d_s, shape.head_dim, shape.heads * shape.head_dim)
    kv = heads_axis(heads.kv, dims, d_s, shape.head_dim, shape.kv_heads * shape.head_dim)
    inter = prefix(cfg["intermediate_size"], shape.intermediate)
    pair = chunks(2, hs, hb)  # [input_layernorm(embedding), hidden_norm(g)]
    for name in small:
        module = name.removesuffix(".weight").rsplit(".", 1)[-1]
        if module in ("d2t", "t2d"):
            plan.put(name, name, [prefix(n, n) for n in small[name].shape])
        elif module == "fc":
            plan.put(name, name, [st.hidden(), chunks(small[name].shape[1] // hs, hs, hb)])
        elif module in ("input_layernorm", "hidden_norm", "post_attention_layernorm", "norm"):
            plan.put(name, name, [st.hidden()])
        elif module == "q_proj":
            plan.put(name, name, [q, pair], math.sqrt(shape.head_dim / d_s) / st.s)
        elif module in ("k_proj", "v_proj"):
            plan.put(name, name, [kv, pair], 1 / st.s)
        elif module == "o_proj":
            plan.put(name, name, [st.hidden(), q], st.t)
        elif module in ("gate_proj", "up_proj"):
            plan.put(name, name, [inter, st.hidden()], 1 / st.s)
        elif module == "down_proj":
            plan.put(name, name, [st.hidden(), inter], st.t)
        elif module == "lm_head":
            plan.put(
                name,
                name,
                [prefix(small[name].shape[0], small[name].shape[0]), st.hidden()],
                1 / st.s,
            )
        else:
            raise KeyError(f"widen_eagle3: no rule for tensor {name!r}")
    new = dtype_config(
        {
            **cfg,
            "hidden_size": hb,
            "target_hidden_size": hb,
            "intermediate_size": shape.intermediate,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6) * st.eps_factor,
        },
        dtype,
        src.name,
        {"hidden_size": hs, "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6)},
    )
    if embed_scale is not None:
        new["embed_scale"] = embed_scale
    return write_widened(plan, new, src, dst, max_shard_bytes)


def widen_zoo_pair(
    widen_target: Callable[..., Path],
    name: str,
    zoo_dir: str | Path,
    out_dir: str | Path,
    shape: object,
    draft: DraftShape,
    dtype: torch.dtype,
    max_shard_bytes: int,
    draft_stream: Callable[[dict, dict], tuple[Stream, float | None]],
) -> dict[str, Path]:
    """Zoo target ``name`` widened by ``widen_target(src, dst, shape, dtype, max_shard_bytes)`` and its
    EAGLE3 draft ``name-eagle3`` by ``widen_eagle3`` into ``out_dir/<name>``: name -> directory.
    ``draft_stream(target config, draft config)`` gives the draft's stream and embed scale."""
    zoo, out, eagle = Path(zoo_dir), Path(out_dir), f"{name}-eagle3"
    target = widen_target(zoo / name, out / name, shape, dtype, max_shard_bytes)
    cfgs = [json.loads((zoo / n / "config.json").read_text()) for n in (name, eagle)]
    stream, embed_scale = draft_stream(*cfgs)
    draft_dir = widen_eagle3(
        zoo / eagle, out / eagle, stream, draft, dtype, embed_scale, max_shard_bytes
    )
    return {name: target, eagle: draft_dir}
