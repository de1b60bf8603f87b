"""Widen the trained zoo models into a large shape (the Llama-3.1-8B one) so that they compute the
same function: the large-scale benchmarks then run models of the real size whose tokens, and whose
drafts' acceptance, are the zoo's (issue 15, item 4).

Every weight is zero-padded, real indices first, with these maps and scales (small shape s, big b;
r = H_s / H_b the hidden ratio, k = d_b / d_s the head-dim ratio, an integer):

- Residual stream: hidden dim i stays i; dims >= H_s stay exactly 0 through the whole model, since
  every matrix writing the stream (embedding, o_proj, down_proj, eh_proj, fc) has zero rows there.
- RMSNorm (outpace/layers/norm.py: x * rsqrt(mean(x^2) + eps) * w, mean over the last dim): with the
  padded dims zero, mean_b(x^2) = r * mean_s(x^2). With eps_b = r * eps and w_b = sqrt(r) * w:
  w_b x / sqrt(r mean_s + r eps) = w x / sqrt(mean_s + eps), the small norm's output on the real
  dims (0 on the others). Norm outputs only feed matrices (q/k/v, gate/up, eh_proj, heads), so the
  next layer sees exactly the small values. ``rms_norm_eps`` is one config field, so every norm of
  a checkpoint gets the same r (see q/k norms below).
- RoPE, neox layout (outpace/layers/rotary.py ``_rotate``: dim i pairs with i + d/2, frequency
  theta^(-2i/d)): pair j of a small head lands on pair k*j of the big head, i.e. dim j -> k*j and
  d_s/2 + j -> d_b/2 + k*j, whose frequency theta^(-2kj/d_b) = theta^(-2j/d_s) is the same float
  (the float64 exponents 2kj/d_b and 2j/d_s are the same exact quotient: bit-identical cos/sin
  tables, for llama3/linear rope scaling too, which act per frequency). The other pairs hold zeros.
  v and the o_proj columns use the same per-head map (any consistent map would do).
- Attention scale head_dim^-0.5 (outpace/attention/layer.py): q is multiplied by sqrt(k) (2 for
  32 -> 128), so q_b . k_b / sqrt(d_b) = q . k / sqrt(d_s).
- Heads: GQA q head h reads kv head h // group (torch SDPA ``enable_gqa`` in the torch backend;
  attention/triton_kernels.py's rows: q head kv_head * GROUP + m). Small kv head g stays g; small
  q head h = g * group_s + m lands on big q head g * group_b + m (so group_b >= group_s is
  required). Unused q heads have zero q, so they attend uniformly and output the mean of v -- not
  zero -- but their o_proj columns are zero, so they add nothing. Unused kv heads have zero k, v.
- Per-head q/k RMSNorm (Qwen3 layers: the DFlash draft; outpace/models/llama.py builds them with the
  config's single ``rms_norm_eps``, which the hidden norms fix to r * eps): q_proj and k_proj are
  scaled by c = sqrt(r * k) so that the per-head mean over d_b dims is c^2 / k * mean_s = r * mean_s,
  matching eps_b = r * eps; then the k_norm weight is w / sqrt(k) and the q_norm weight w (the
  sqrt(k) of the attention scale folded in). For 256 -> 4096 and 32 -> 128: c = 1/2.
- MLP: intermediate units i stay i; padded units have zero gate and up, silu(0) * 0 = 0.
- Concatenated inputs (EAGLE3 ``fc`` over 3 target states and its layer's q/k/v over
  [embedding, hidden]; MTP ``eh_proj`` over [enorm(embed), hnorm(hidden)]; DFlash ``fc``): small
  input column c * H_s + i lands on c * H_b + i.
- Layers past the trained ones are all-zero blocks: the zero input norm makes q, k, v and the MLP
  input zero, so attention and MLP add exactly 0 and the residual stream passes through. The MTP
  layers, stored after the decoder layers (``model.layers.{num_hidden_layers + k}``, models/llama.py
  ``checkpoint_name``), move to ``model.layers.{32 + k}``; they read the last pre-norm state, which
  the zero layers leave equal to the trained layers' output.
- Drafts: EAGLE3 and DFlash borrow the target's embedding (and DFlash its head), so their width is
  the target's: they take the target's big shape with their own layer count. Their target layer
  ids are unchanged (the trained layers come first; a capture of "the last layer's output" and of
  "layer 6's input" are the same stream value), DFlash's ``num_target_layers`` becomes the new
  count, EAGLE3's ``target_hidden_size`` the new hidden size; ``d2t``/``t2d`` and the vocabulary
  are copied unchanged. The standalone draft has its own embedding and may take any shape:
  ``LLAMA_1B``, the Llama-3.2-1B shape, the usual draft of Llama-3.1-8B (same tokenizer family, an
  eighth of the cost), is the default for ``LLAMA_8B``; drafting with a model as large as the
  target (the literal 8B shape) would make the standalone-draft numbers meaningless.

Vocabulary, ``rope_theta``, rope scaling and ``max_position_embeddings`` stay as they are (the
frequencies must stay the small model's). Exactness: in real arithmetic the widened model computes
the zoo model's function exactly. In floats, zero products add exact zeros but longer reductions may
be summed in another order: last-bit differences in fp32; in bf16 an activation may now and then
round the other way, so greedy tokens can part only where two logits nearly tie. For the zoo into ``LLAMA_8B`` every scale
is a power of two (sqrt(r) = 1/4, sqrt(k) = 2, c = 1/2), so bf16 weights are the zoo's bf16 bits
times powers of two; into ``LLAMA_1B`` (r = 3/32, k = 2) the standalone draft's scales are
irrational and rounded once to the output dtype.

The writer streams: the header of each safetensors shard is computed from shapes alone, then each
tensor is built, written and dropped (the 8B target is ~16 GB in bf16, memory holds one tensor).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open
from tqdm.auto import tqdm


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int

    @classmethod
    def of(cls, cfg: dict) -> Shape:
        """The shape a Hugging Face config.json declares."""
        heads = cfg["num_attention_heads"]
        return cls(
            cfg["hidden_size"],
            cfg["num_hidden_layers"],
            heads,
            cfg.get("num_key_value_heads") or heads,
            cfg.get("head_dim") or cfg["hidden_size"] // heads,
            cfg["intermediate_size"],
        )


# meta-llama/Llama-3.1-8B and Llama-3.2-1B config.json (head_dim = hidden_size / num_attention_heads)
LLAMA_8B = Shape(hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128, intermediate=14336)
LLAMA_1B = Shape(hidden=2048, layers=16, heads=32, kv_heads=8, head_dim=64, intermediate=8192)
DRAFT_SHAPES = {LLAMA_8B: LLAMA_1B}  # a target shape -> the shape of its standalone draft

NORMS = ("input_layernorm", "post_attention_layernorm", "norm", "enorm", "hnorm", "hidden_norm")
MAX_SHARD_BYTES = 4 << 30


@dataclass(frozen=True)
class Widening:
    """The index maps and scales from one small checkpoint's shape to a big one (module docstring).
    ``in_hidden``: (small, big) width of the states an EAGLE3/DFlash ``fc`` reads, the target's."""

    small: Shape
    big: Shape
    qk_norm: bool = False
    in_hidden: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        s, b = self.small, self.big
        problems = [
            f"{f} {getattr(s, f)} > {getattr(b, f)}"
            for f in ("hidden", "layers", "intermediate", "kv_heads")
            if getattr(s, f) > getattr(b, f)
        ]
        if b.head_dim % s.head_dim or s.head_dim % 2:
            problems.append(f"head_dim {b.head_dim} is not a multiple of the even {s.head_dim}")
        if b.heads % b.kv_heads or b.heads // b.kv_heads < s.heads // s.kv_heads:
            problems.append(f"q heads per kv head {b.heads}/{b.kv_heads} < {s.heads}/{s.kv_heads}")
        if problems:
            raise ValueError(f"cannot widen {s} into {b}: " + "; ".join(problems))

    @property
    def ratio(self) -> float:
        """r = H_s / H_b: eps_b = r * eps, hidden norm weights times sqrt(r)."""
        return self.small.hidden / self.big.hidden

    def head_dims(self) -> torch.Tensor:
        """[d_s] -> big head dim of each small head dim: rotate-half pair j -> pair k * j."""
        k, half = self.big.head_dim // self.small.head_dim, self.small.head_dim // 2
        j = torch.arange(half)
        return torch.cat([k * j, self.big.head_dim // 2 + k * j])

    def _heads(self, big_heads: list[int]) -> torch.Tensor:
        d = self.big.head_dim
        return torch.cat([h * d + self.head_dims() for h in big_heads])

    def q_rows(self) -> torch.Tensor:
        """[heads_s * d_s]: small q head h = g * group_s + m -> big q head g * group_b + m."""
        gs, gb = self.small.heads // self.small.kv_heads, self.big.heads // self.big.kv_heads
        return self._heads([(h // gs) * gb + h % gs for h in range(self.small.heads)])

    def kv_rows(self) -> torch.Tensor:
        return self._heads(
            list(range(self.small.kv_heads))
        )  # [kv_heads_s * d_s]: kv head g stays g

    def chunks(self, n: int, hidden: tuple[int, int] | None = None) -> torch.Tensor:
        """[n * H_s]: input column c * H_s + i -> c * H_b + i (n = 1: the plain hidden map)."""
        hs, hb = hidden or (self.small.hidden, self.big.hidden)
        return torch.cat([c * hb + torch.arange(hs) for c in range(n)])

    def plan(
        self, name: str, shape: tuple[int, ...]
    ) -> tuple[list[tuple[torch.Tensor, int]], float]:
        """A checkpoint tensor's name and small shape -> ([(index map, big size)] per axis, scale).
        Raises KeyError for a tensor it does not know."""
        s, b = self.small, self.big
        module = name.removesuffix(".weight").rsplit(".", 1)[-1]
        H = (torch.arange(s.hidden), b.hidden)
        Q, KV = (self.q_rows(), b.heads * b.head_dim), (self.kv_rows(), b.kv_heads * b.head_dim)
        k = b.head_dim / s.head_dim
        c = math.sqrt(self.ratio * k)  # q and k scale under per-head norms
        if module in ("d2t", "t2d"):
            return [(torch.arange(n), n) for n in shape], 1.0
        if module in ("embed_tokens", "lm_head", "head"):  # [vocab, H]
            return [(torch.arange(shape[0]), shape[0]), H], 1.0
        if module in NORMS:  # [H]
            return [H], math.sqrt(self.ratio)
        if module in ("q_norm", "k_norm"):  # [head_dim]
            return [(self.head_dims(), b.head_dim)], 1.0 if module == "q_norm" else 1 / math.sqrt(k)
        if module in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "eh_proj", "fc"):
            hidden = self.in_hidden if module == "fc" and self.in_hidden else (s.hidden, b.hidden)
            n = shape[1] // hidden[0]
            cols = (self.chunks(n, hidden), n * hidden[1])  # [out, n * H]
            rows = {"q_proj": Q, "k_proj": KV, "v_proj": KV}.get(module, H)
            if module in ("gate_proj", "up_proj"):
                rows = (torch.arange(s.intermediate), b.intermediate)
            scale = {
                "q_proj": c if self.qk_norm else math.sqrt(k),
                "k_proj": c if self.qk_norm else 1.0,
            }
            return [rows, cols], scale.get(module, 1.0)
        if module == "o_proj":  # [H, heads * head_dim]
            return [H, Q], 1.0
        if module == "down_proj":  # [H, intermediate]
            return [H, (torch.arange(s.intermediate), b.intermediate)], 1.0
        raise KeyError(f"widen: no rule for tensor {name!r} {tuple(shape)}")

    def big_shape(self, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(size for _, size in self.plan(name, shape)[0])

    def tensor(
        self, name: str, t: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """A small checkpoint tensor -> its widened value (floating tensors in ``dtype``, others as they are)."""
        axes, scale = self.plan(name, tuple(t.shape))
        if not t.is_floating_point():
            return t.clone()
        out = torch.zeros([size for _, size in axes], dtype=dtype)
        value = (t.double() * scale).to(dtype)  # the product rounded once
        index = tuple(idx.view([-1] + [1] * (len(axes) - 1 - a)) for a, (idx, _) in enumerate(axes))
        out[index] = value
        return out

    def config(self, cfg: dict, dtype: torch.dtype, source: str) -> dict:
        """A config.json with the big shape, the norms' eps times r, the output dtype and provenance."""
        b, eps = self.big, cfg.get("rms_norm_eps", 1e-6)
        dtype_name = str(dtype).removeprefix("torch.")
        out = {
            **cfg,
            "hidden_size": b.hidden,
            "intermediate_size": b.intermediate,
            "num_attention_heads": b.heads,
            "num_key_value_heads": b.kv_heads,
            "head_dim": b.head_dim,
            "rms_norm_eps": eps * self.ratio,
            "torch_dtype": dtype_name,
            "widened_from": {"checkpoint": source, **vars(self.small), "rms_norm_eps": eps},
        }
        if "dtype" in cfg:  # transformers >= 5 writes both
            out["dtype"] = dtype_name
        return out


# ---- writing ------------------------------------------------------------------------------------

Entry = tuple[
    str, tuple[int, ...], torch.dtype, Callable[[], torch.Tensor]
]  # name, shape, dtype, builder

_ST_DTYPES = {
    torch.float32: "F32",
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.int64: "I64",
    torch.bool: "BOOL",
}


def _nbytes(e: Entry) -> int:
    return math.prod(e[1]) * torch.empty((), dtype=e[2]).element_size()


def _write_safetensors(path: Path, entries: list[Entry], bar: tqdm) -> None:
    """One safetensors file (format: 8-byte little-endian header length, JSON header of dtype, shape and
    byte offsets, then the raw little-endian bytes), written one tensor at a time."""
    header, offset = {}, 0
    for e in entries:
        header[e[0]] = {
            "dtype": _ST_DTYPES[e[2]],
            "shape": list(e[1]),
            "data_offsets": [offset, offset + _nbytes(e)],
        }
        offset += _nbytes(e)
    header["__metadata__"] = {"format": "pt"}
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for name, shape, dtype, build in entries:
            t = build()
            assert tuple(t.shape) == shape and t.dtype == dtype, (
                name,
                t.shape,
                shape,
                t.dtype,
                dtype,
            )
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            bar.update()


def write_checkpoint(
    out_dir: Path,
    entries: list[Entry],
    max_shard_bytes: int = MAX_SHARD_BYTES,
    desc: str = "widening",
) -> None:
    """Safetensors shards of at most ``max_shard_bytes`` (and an index when more than one), streamed.
    Weight files an earlier run left in ``out_dir`` are removed first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in [*out_dir.glob("model*.safetensors"), out_dir / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    shards: list[list[Entry]] = [[]]
    filled = 0  # bytes of the last shard
    for e in entries:
        if shards[-1] and filled + _nbytes(e) > max_shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(e)
        filled += _nbytes(e)
    names = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    with tqdm(total=len(entries), desc=desc, unit="tensor") as bar:
        for shard, name in zip(shards, names):
            _write_safetensors(out_dir / name, shard, bar)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(map(_nbytes, entries))},
            "weight_map": {e[0]: n for shard, n in zip(shards, names) for e in shard},
        }
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def copy_tokenizer(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in (
            "special_tokens_map.json",
            "generation_config.json",
            "added_tokens.json",
            "vocab.json",
            "merges.txt",
        ):
            shutil.copy2(f, dst / f.name)


def _widen_dir(
    src: Path,
    dst: Path,
    widening: Widening,
    cfg: dict,
    dtype: torch.dtype,
    rename: Callable[[str], str],
    extra: Callable[[dict[str, tuple[int, ...]]], list[Entry]],
    max_shard_bytes: int,
) -> Path:
    """Every tensor of ``src`` (one safetensors file, as the zoo's), widened and renamed, then ``extra``
    entries (given the big shapes written); the config, and the tokenizer files copied."""
    path = src / "model.safetensors"
    with safe_open(str(path), framework="pt") as f:
        small = {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
        dtypes = {n: f.get_slice(n).get_dtype() for n in f.keys()}

    def build(name: str) -> Callable[[], torch.Tensor]:
        def make() -> torch.Tensor:
            with safe_open(str(path), framework="pt") as f:
                return widening.tensor(name, f.get_tensor(name), dtype)

        return make

    entries: list[Entry] = []
    for name, shape in small.items():
        kept = {"I64": torch.int64, "BOOL": torch.bool}.get(dtypes[name], dtype)
        entries.append((rename(name), widening.big_shape(name, shape), kept, build(name)))
    entries += extra({e[0]: e[1] for e in entries})
    write_checkpoint(dst, entries, max_shard_bytes, desc=f"widening {src.name}")
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    copy_tokenizer(src, dst)
    return dst


def widen_checkpoint(
    src_dir: str | Path,
    dst_dir: str | Path,
    shape: Shape = LLAMA_8B,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """A Llama-family checkpoint (the zoo target with its MTP layers, or the standalone draft) -> the
    same function in ``shape``: the trained layers first, then all-zero layers, then the MTP layers."""
    src, dst = Path(src_dir), Path(dst_dir)
    cfg = json.loads((src / "config.json").read_text())
    small = Shape.of(cfg)
    with safe_open(str(src / "model.safetensors"), framework="pt") as f:
        qk_norm = any(n.endswith("q_norm.weight") for n in f.keys())
    w = Widening(small, shape, qk_norm)

    def rename(name: str) -> str:  # MTP layers follow the decoder layers: model.layers.{L + k}
        m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name)
        if m and int(m[1]) >= small.layers:
            return f"model.layers.{int(m[1]) - small.layers + shape.layers}.{m[2]}"
        return name

    def zero_layers(written: dict[str, tuple[int, ...]]) -> list[Entry]:
        layer0 = {
            n.removeprefix("model.layers.0."): s
            for n, s in written.items()
            if n.startswith("model.layers.0.")
        }
        return [
            (f"model.layers.{i}.{suffix}", s, dtype, lambda s=s: torch.zeros(s, dtype=dtype))
            for i in range(small.layers, shape.layers)
            for suffix, s in layer0.items()
        ]

    return _widen_dir(
        src,
        dst,
        w,
        {**w.config(cfg, dtype, src.name), "num_hidden_layers": shape.layers},
        dtype,
        rename,
        zero_layers,
        max_shard_bytes,
    )


def widen_draft(
    src_dir: str | Path,
    dst_dir: str | Path,
    target: Shape = LLAMA_8B,
    dtype: torch.dtype = torch.bfloat16,
    draft_shape: Shape | None = None,
    target_hidden: int | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> Path:
    """A draft trained for the zoo target -> the same draft for the target widened into ``target``.
    EAGLE3 and DFlash drafts take the target's width with their own layer count; a standalone Llama
    draft takes ``draft_shape`` (default ``DRAFT_SHAPES[target]``). ``target_hidden``: the small
    target's hidden size (default: EAGLE3's ``target_hidden_size``, DFlash's own hidden size, which
    must equal the target's)."""
    src, dst = Path(src_dir), Path(dst_dir)
    cfg = json.loads((src / "config.json").read_text())
    arch = (cfg.get("architectures") or [""])[0]
    if arch not in ("LlamaForCausalLMEagle3", "DFlashDraftModel"):
        if draft_shape is None and target not in DRAFT_SHAPES:
            raise ValueError(
                f"no standalone draft shape is known for the target shape {target}: pass draft_shape"
            )
        return widen_checkpoint(
            src, dst, draft_shape or DRAFT_SHAPES[target], dtype, max_shard_bytes
        )
    small = Shape.of(cfg)
    hs = target_hidden or cfg.get("target_hidden_size") or small.hidden
    w = Widening(
        small, replace(target, layers=small.layers), arch == "DFlashDraftModel", (hs, target.hidden)
    )
    new = w.config(cfg, dtype, src.name)
    if arch == "DFlashDraftModel":
        new["num_target_layers"] = (
            target.layers
        )  # its target_layer_ids stay: the trained layers come first
    else:
        new["target_hidden_size"] = target.hidden  # eagle_aux_hidden_state_layer_ids, d2t, t2d stay
    return _widen_dir(src, dst, w, new, dtype, lambda n: n, lambda written: [], max_shard_bytes)


def widen_zoo(
    zoo_dir: str | Path,
    out_dir: str | Path,
    shape: Shape = LLAMA_8B,
    draft_shape: Shape | None = None,
    dtype: torch.dtype = torch.bfloat16,
    max_shard_bytes: int = MAX_SHARD_BYTES,
) -> dict[str, Path]:
    """The zoo's target and its three drafts, widened into ``out_dir/<name>``: name -> directory."""
    zoo, out = Path(zoo_dir), Path(out_dir)
    hidden = Shape.of(json.loads((zoo / "tinypy" / "config.json").read_text())).hidden
    dirs = {
        "tinypy": widen_checkpoint(zoo / "tinypy", out / "tinypy", shape, dtype, max_shard_bytes)
    }
    for name in ("tinypy-eagle3", "tinypy-dflash", "tinypy-draft"):
        dirs[name] = widen_draft(
            zoo / name, out / name, shape, dtype, draft_shape, hidden, max_shard_bytes
        )
    return dirs
