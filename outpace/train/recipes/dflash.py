"""``outpace train draft --method dflash``: a DFlash block-diffusion draft trained on the target's own
continuations (sampled at temperature 0.4).

Shapes follow the target (hidden size, heads, head_dim, intermediate size): the draft borrows the
target's embedding and head, so its checkpoint holds neither. It reads the outputs of a few target
layers spread over the depth (6 layers: outputs of layers 1, 3, 5), fused by ``fc`` + ``hidden_norm``.
The mask token is the target tokenizer's ``mask_token`` (the zoo's ``<|mask|>``, id 2).

Training, for token windows x [b, T] = a corpus prompt (rows < prompt_len) and the target's continuation
(the target runs once per batch, no gradient, and gives the capture layers' states and its logits):
- per window, ``num_anchors`` distinct anchors a in the continuation, a in [prompt_len - 1, T - B + 1] (from 1 in a
  raw corpus window, which has no prompt)
  (SpecForge samples anchors only where its loss mask is set, i.e. in the regenerated response;
  specforge/core/dflash.py ``_sample_anchors``), hundreds per sequence there (``num_anchors`` 512);
- per anchor, the block [x_a, mask x (B - 1)] at positions a .. a + B - 1 whose rows attend to the
  context features of rows < a and to the whole block (non-causal): exactly what the serving draft
  sees when x_a is the bonus token at position a (``block_attention``: the context part and each
  block's own part under one softmax, so hundreds of blocks per window cost no T + K * B square mask);
- block row i >= 1 is scored against the target's own choice for position a + i: its argmax at row
  a + i - 1 (hard label; SpecForge's loss is the cross-entropy on the regenerated tokens), plus
  ``soft_label_weight`` times the soft cross-entropy against its distribution there, weighted by
  exp(-(i - 1) / gamma) (the DFlash paper's decay; gamma 4 for block 8 as in NVIDIA Model-Optimizer's
  DFlash default, 7 for block 16 in SpecForge's configs) and normalised by the sum of the weights.

Why continuations sampled at temperature 0.4, neither greedy nor 0.8: at temperature 0 row i is accepted only when
rows 1 .. i - 1 were the target's greedy tokens, and a draft cannot see the tokens between the anchor and row i, so
a label is what greedy verification asks for only when the sampled tokens before it are argmax tokens; sampling
gives more varied text to learn on. At T = 0.8 the zoo target's sampled tokens are its argmax 72% of the time and
row 7's label is on that path for 0.21 of anchors; at T = 0.4, 93% and 0.71 (benchmarks/scripts/diag_dflash_label_path.py).
At the zoo's whole-run budget (about 9 minutes on an H200, 49152 continuations; benchmarks/results/train_dflash_depth)
held-out tau at T = 0 was, for 2 / 4 / 6 layers (intermediate 640 / 256 / 128), 2.85 / 3.38 / 3.47 with T = 0.8 data
and 3.02 / 3.49 / - with greedy data; 6 layers with T = 0.4 data reached 3.73 (greedy and T = 0.2: 3.59 and 3.60, on
a 9% shorter budget). T = 0.8 data gives the best tau at temperature 1 (2.05 against 1.85). The 650-step ablation
row "greedy data" (benchmarks/results/train_ablation_gpu) is far earlier in training, where sampled data won.

Why half of each batch is raw corpus windows: the 6-layer draft over-fits 49152 continuations (its last batch agreed
with the target on 0.91 of block row 1, held-out 0.80), and twice the continuations cost the budget's training
time in generation (tau 2.91). Corpus windows cost no generation; their labels are still the target's argmax, and
their anchors may fall anywhere in the window. At the same budget they gave 3.79 (T = 1: 2.04) against 3.73
(1.85), and 1.85 against 1.77 in the 500-step ablation (benchmarks/results/train_ablation_gpu_500steps).
"""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.drafts.dflash import (
    DFlashConfig,
    DFlashDraft,
    layers_outside,
    tokenizer_mask_token_id,
)
from outpace.models.loader import default_dtype
from outpace.train.distill import (
    TrajectoryDistillRecipe,
    distillation_inputs,
    part_metrics,
    prompt_source,
    soft_cross_entropy,
    teacher_forward,
    unused_files_note,
    weighted_loss,
    window_source,
)
from outpace.train.evaluate import finish_with_heldout, heldout_section
from outpace.train.export import common_metrics, save_trained
from outpace.train.loop import train
from outpace.train.ranks import ONE_RANK, TrainRanks
from outpace.train.resume import Resume
from outpace.train.run_checks import check_run, run_identity
from outpace.train.target import init_weights


@dataclass(frozen=True)
class DFlashRecipe(TrajectoryDistillRecipe):
    data_temperature: float = 0.4  # sampled continuations (module docstring)
    corpus_fraction: float = 0.5  # raw corpus windows beside them (module docstring)
    block_size: int = 8  # B: B - 1 drafts per verify
    num_layers: int = 5  # SpecForge's DFlash configs: 5 (10 for Qwen3-32B)
    intermediate_size: int | None = None  # None: the target's
    num_key_value_heads: int | None = (
        None  # None: the target's; fewer buys depth within a size budget
    )
    target_layer_ids: tuple[int, ...] | None = (
        None  # "output of layer X"; None: default_target_layer_ids(L)
    )
    num_anchors: int = 64  # blocks per training window, all in the continuation
    loss_gamma: float = 4.0  # block row i weighs exp(-(i - 1) / gamma)
    soft_label_weight: float = 0.0  # loss = hard CE + this x soft CE (vs the target's distribution)
    init_norm_from_target: bool = True  # the final norm starts as the target's (its head follows)
    max_checkpoint_mib: float | None = None  # bf16 size budget of the saved draft (the zoo's: 4)
    max_minutes: float | None = 4.5
    compile_step: bool = True  # H100, batch 128: 2.4x eager (benchmarks/results/train_compile); its
    # check, tests/train/test_train_compile.py, passed there 2026-11-27

    def __post_init__(self) -> None:
        super().__post_init__()
        check = self.check
        check("block_size", self.block_size >= 2, ">= 2 (the bonus token and at least one mask)")
        check("num_layers", self.num_layers >= 1, ">= 1")
        check(
            "intermediate_size",
            self.intermediate_size is None or self.intermediate_size >= 1,
            "None (the target's) or >= 1",
        )
        check(
            "target_layer_ids",
            self.target_layer_ids is None or len(self.target_layer_ids) > 0,
            "None (the default layers) or at least one layer id",
        )
        check(
            "num_key_value_heads",
            self.num_key_value_heads is None or self.num_key_value_heads >= 1,
            ">= 1 or None",
        )
        check(
            "max_checkpoint_mib",
            self.max_checkpoint_mib is None or self.max_checkpoint_mib > 0,
            "> 0 or None",
        )
        check("num_anchors", self.num_anchors >= 1, ">= 1")
        check("loss_gamma", self.loss_gamma > 0, "> 0")
        check("soft_label_weight", self.soft_label_weight >= 0, ">= 0")
        check("prompt_len", self.prompt_len >= 2, ">= 2 (an anchor needs a context row before it)")
        check(
            "new_tokens",
            self.new_tokens - self.block_size + 2 >= self.num_anchors,
            f"such that new_tokens - block_size + 2 >= num_anchors ({self.num_anchors} distinct anchors in "
            "each continuation)",
        )

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @classmethod
    def toy(cls, **overrides) -> DFlashRecipe:
        """A CPU-sized recipe for tests: trains in seconds."""
        return super().toy(**{**dict(block_size=4, num_layers=1, num_anchors=8), **overrides})


# ---------------------------------------------------------------------------------------------
# Config


def default_target_layer_ids(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` target layers (output-of ids) spread from layer 1 to the last: 6 layers -> (1, 3, 5).
    Shallow targets get fewer distinct ids (3 layers -> (1, 2); 1 layer -> (0,))."""
    if num_layers < 2:
        return (0,)
    span = num_layers - 2
    return tuple(sorted({1 + round(k * span / max(count - 1, 1)) for k in range(count)}))


def checkpoint_mib(cfg: DFlashConfig, target_hidden: int) -> float:
    """The draft's bf16 checkpoint size, its parameters counted on the meta device."""
    with torch.device("meta"):
        return 2 * sum(p.numel() for p in DFlashDraft(cfg, target_hidden).parameters()) / 2**20


def dflash_config(
    target_cfg: ModelConfig,
    recipe: DFlashRecipe,
    target_layer_ids: tuple[int, ...],
    mask_token_id: int,
) -> dict:
    """config.json in the public DFlash v1 format (``DFlashDraftModel``, Qwen3-style layers)."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": recipe.intermediate_size or target_cfg.intermediate_size,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": recipe.num_key_value_heads or target_cfg.num_key_value_heads,
        "head_dim": target_cfg.head_dim,
        "num_hidden_layers": recipe.num_layers,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_theta": target_cfg.rope_theta,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "vocab_size": target_cfg.vocab_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "num_target_layers": target_cfg.num_hidden_layers,
        "block_size": recipe.block_size,
        "dflash_config": {
            "block_size": recipe.block_size,
            "mask_token_id": mask_token_id,
            "target_layer_ids": list(target_layer_ids),
        },
    }
    if target_cfg.rope_scaling is not None:
        cfg["rope_scaling"] = target_cfg.rope_scaling
    return cfg


# ---------------------------------------------------------------------------------------------
# Blocks and the training forward


def sample_anchors(
    batch: int,
    seq_len: int,
    block_size: int,
    num_anchors: int,
    generator: torch.Generator,
    first: torch.Tensor | int = 1,
) -> torch.Tensor:
    """[batch, num_anchors] int64: distinct anchors per window in [first, seq_len - block_size + 1], sorted.

    ``first``: the lowest anchor, one for all windows or [batch] (at least 1: an anchor needs a context
    row). Anchor a needs the target's logits at row a + B - 2 <= seq_len - 1 (the label of its last row).
    """
    last = seq_len - block_size + 1
    first = torch.as_tensor(first).expand(batch)[:, None]  # [batch, 1]
    candidates = torch.arange(last + 1)[None, :]  # [1, last + 1]
    keys = torch.rand(batch, last + 1, generator=generator).masked_fill(candidates < first, 2.0)
    picks = keys.argsort(dim=1)[:, :num_anchors]
    if (picks < first).any():
        raise ValueError(
            f"a window has fewer than {num_anchors} anchors in [{first.min().item()}, {last}]"
        )
    return picks.sort(dim=1).values


def block_ids_and_positions(
    tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int
):
    """tokens [b, T], anchors [b, K] -> (ids [b, K, B]: x_a then mask tokens, positions [b, K, B]: a + i)."""
    positions = anchors[:, :, None] + torch.arange(block_size, device=tokens.device)  # [b, K, B]
    ids = torch.full_like(positions, mask_token_id)
    ids[:, :, 0] = tokens.gather(1, anchors)
    return ids, positions


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """The blocks in the explicit-mask form of ``DFlashDraft.forward_dense``, flattened anchor-major.

    tokens [b, T], anchors [b, K] -> (block_ids [b, K * B], block_positions [b, K * B],
    mask [b, K * B, T + K * B] bool). Row (k, i) may attend to context rows t < a_k and to every row of
    its own block. Training runs ``dflash_forward`` instead (no square mask); the tests hold the two equal.
    """
    b, t = tokens.shape
    k = anchors.shape[1]
    dev = tokens.device
    ids, positions = block_ids_and_positions(tokens, anchors, block_size, mask_token_id)
    context = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]  # [b, K, T]
    context = context[:, :, None, :].expand(b, k, block_size, t).reshape(b, k * block_size, t)
    same_block = torch.arange(k, device=dev).repeat_interleave(
        block_size
    )  # [K * B] block of each row
    own = (same_block[:, None] == same_block[None, :]).expand(b, -1, -1)  # [b, K * B, K * B]
    return ids.reshape(b, -1), positions.reshape(b, -1), torch.cat([context, own], dim=2)


def block_attention(
    q: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    k_blk: torch.Tensor,
    v_blk: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Attention of every block row over [the context rows its anchor sees, the rows of its own block].

    q [b, K, B, heads, d]; k_ctx, v_ctx [b, T, kv_heads, d]; k_blk, v_blk [b, K, B, kv_heads, d];
    visible [b, K, T] bool (context row t is seen by block k: t < a_k). One softmax over both parts;
    query head h reads kv head h // (heads // kv_heads). Returns [b, K, B, heads * d].
    """
    b, k, n, heads, d = q.shape
    t, kv_heads = k_ctx.shape[1], k_ctx.shape[2]
    g = heads // kv_heads
    qh = q.reshape(b, k, n, kv_heads, g, d).permute(0, 3, 4, 1, 2, 5)  # [b, kvh, g, K, B, d]
    kc, vc = (x.permute(0, 2, 1, 3)[:, :, None] for x in (k_ctx, v_ctx))  # [b, kvh, 1, T, d]
    kb, vb = (x.permute(0, 3, 1, 2, 4)[:, :, None] for x in (k_blk, v_blk))  # [b, kvh, 1, K, B, d]
    s_ctx = (qh.reshape(b, kv_heads, g, k * n, d) @ kc.transpose(-1, -2)).view(
        b, kv_heads, g, k, n, t
    )
    s_ctx = s_ctx.masked_fill(~visible[:, None, None, :, None, :], float("-inf"))
    s_blk = qh @ kb.transpose(-1, -2)  # [b, kvh, g, K, B, B]
    probs = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1).float() * scale, dim=-1).to(q.dtype)
    out = (probs[..., :t].reshape(b, kv_heads, g, k * n, t) @ vc).view(b, kv_heads, g, k, n, d)
    out = out + probs[..., t:] @ vb  # [b, kvh, g, K, B, d]
    return out.permute(0, 3, 4, 1, 2, 5).reshape(b, k, n, heads * d)


def dflash_forward(
    draft: DFlashDraft,
    embed: Callable[[torch.Tensor], torch.Tensor],
    aux: torch.Tensor,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
) -> torch.Tensor:
    """aux [b, T, num_features * target_hidden], tokens [b, T], anchors [b, K] -> the block rows'
    pre-norm outputs [b, K, B, hidden] (row i of block k at position anchors[:, k] + i).

    The same layers as serving (``DFlashDraft.forward``): per layer, queries and keys/values of the block
    rows from the residual stream, keys/values of the context rows from the fused features."""
    cfg = draft.config
    b, t = tokens.shape
    k, n = anchors.shape[1], cfg.block_size
    ids, positions = block_ids_and_positions(tokens, anchors, n, cfg.mask_token_id)
    context = draft.fuse(aux).reshape(b * t, -1)  # [b * T, hidden]
    context_positions = torch.arange(t, device=tokens.device).repeat(b)
    visible = (
        torch.arange(t, device=tokens.device)[None, None, :] < anchors[:, :, None]
    )  # [b, K, T]
    block_positions = positions.reshape(-1)
    # NOTE: the residual stream starts in the draft's precision (fp32 masters under autocast), not the target's.
    h = embed(ids.reshape(-1)).to(context.dtype)  # [b * K * B, hidden]
    for layer in draft.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        q = attn.query(x, block_positions)  # [b * K * B, heads, d]
        k_blk, v_blk = attn.key_value(x, block_positions)  # [b * K * B, kv_heads, d]
        k_ctx, v_ctx = attn.key_value(context, context_positions)  # [b * T, kv_heads, d]
        out = block_attention(
            q.view(b, k, n, *q.shape[1:]),
            k_ctx.view(b, t, *k_ctx.shape[1:]),
            v_ctx.view(b, t, *v_ctx.shape[1:]),
            k_blk.view(b, k, n, *k_blk.shape[1:]),
            v_blk.view(b, k, n, *v_blk.shape[1:]),
            visible,
            attn.attn.scale,
        )
        h = h + attn.o_proj(out.reshape(b * k * n, -1).to(h.dtype))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return h.view(b, k, n, -1)


def position_weights(block_size: int, gamma: float) -> list[float]:
    """Weight of block row i = 1 .. B - 1: exp(-(i - 1) / gamma)."""
    return [math.exp(-(i - 1) / gamma) for i in range(1, block_size)]


def teacher_rows(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, K, B - 1]: the target row whose logits give the label of block row i (a + i - 1)."""
    return anchors[:, :, None] + torch.arange(block_size - 1, device=anchors.device)


def block_losses(
    draft: DFlashDraft,
    hidden: torch.Tensor,
    teacher_logits: torch.Tensor,
    soft_label_weight: float = 0.0,
    ranks: TrainRanks = ONE_RANK,
):
    """hidden [b, K, B, hidden] from ``dflash_forward``; teacher_logits [b, K, B - 1, vocab] (the target's
    logits at rows a + i - 1, i = 1 .. B - 1) -> (losses, top-1 agreements) per block row i. The loss is
    the cross-entropy against the target's argmax, plus ``soft_label_weight`` x the soft cross-entropy.
    Over several training ranks, each holding as many rows of the batch (and K blocks per row), a rank's
    mean over its blocks divided by the number of ranks is its share of the mean over all of them."""
    b, k, n, _ = hidden.shape
    student = draft.compute_logits(hidden[:, :, 1:].reshape(b * k * (n - 1), -1)).view(
        b, k, n - 1, -1
    )
    losses, top1 = [], []
    for i in range(n - 1):
        s, t = student[:, :, i].flatten(0, 1), teacher_logits[:, :, i].flatten(0, 1)
        label = t.argmax(-1)
        loss = F.cross_entropy(s.float(), label)
        if soft_label_weight:
            loss = loss + soft_label_weight * soft_cross_entropy(s, t)
        losses.append(loss / ranks.size)
        top1.append((s.argmax(-1) == label).float().mean().detach() / ranks.size)
    return losses, top1


# ---------------------------------------------------------------------------------------------
# The recipe


def train_dflash(
    target_dir: Path, recipe: DFlashRecipe, out_dir: Path, device: str, ranks: TrainRanks = ONE_RANK
) -> dict:
    """Train, save and evaluate the draft; over several ``ranks`` (train/ranks.py) the target is
    tensor-parallel over them and the draft data-parallel (FSDP), each rank taking its rows of every batch."""
    t0 = time.perf_counter()
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    check_run(recipe, target_dir, out_dir)
    declared = tokenizer_mask_token_id(target_dir)
    if declared is None:
        raise ValueError(
            f"target {target_dir} has no tokenizer mask token (tokenizer_config.json mask_token): "
            "a DFlash draft needs one for its block placeholders"
        )
    mask_token, mask_token_id = declared
    # the draft's shape is checked from the target's config before any data is generated
    tcfg = ModelConfig.from_pretrained(target_dir)
    layer_ids = tuple(recipe.target_layer_ids or default_target_layer_ids(tcfg.num_hidden_layers))
    bad = layers_outside(layer_ids, tcfg.num_hidden_layers)
    if bad:
        raise ValueError(
            f"DFlashRecipe.target_layer_ids {list(layer_ids)}: layers {bad} are not in the target's "
            f"0 .. {tcfg.num_hidden_layers - 1}"
        )
    cfg_dict = dflash_config(tcfg, recipe, layer_ids, mask_token_id)
    cfg = DFlashConfig.from_dict(cfg_dict)
    size_mib = checkpoint_mib(cfg, tcfg.hidden_size)
    if recipe.max_checkpoint_mib is not None and size_mib > recipe.max_checkpoint_mib:
        raise ValueError(
            f"the DFlash draft would take {size_mib:.2f} MiB in bf16, over "
            f"DFlashRecipe.max_checkpoint_mib={recipe.max_checkpoint_mib}"
        )
    resume_dir = (
        out_dir / "resume"
    )  # training state while the run lasts; removed once the draft is saved
    rows, data, target = distillation_inputs(target_dir, recipe, resume_dir, device, ranks)
    target.set_aux_hidden_state_layers(cfg.capture_layer_ids)

    with default_dtype(torch.float32), torch.device(device):
        draft = DFlashDraft(cfg, tcfg.hidden_size)
    init_weights(draft, recipe.seed)
    if recipe.init_norm_from_target:
        with torch.no_grad():
            draft.norm.weight.copy_(target.model.norm.weight.float())
    embed = ranks.embedding(target, tcfg.vocab_size)
    draft.borrow(embed, ranks.head(target))
    objective = ranks.shard(
        draft,
        lambda d, embed, aux, tokens, anchors, teacher: block_losses(
            d,
            dflash_forward(d, embed, aux, tokens, anchors),
            teacher,
            recipe.soft_label_weight,
            ranks,
        ),
        recipe.compiles_on(device, ranks.size),
    )
    gen = torch.Generator().manual_seed(
        recipe.seed
    )  # every rank draws the same batches and anchors
    n = recipe.block_size

    def loss_fn(step: int):
        tokens, starts = data.batch_with_starts(recipe.batch_size, gen)
        tokens = tokens.to(device)
        b, t = tokens.shape
        # the lowest anchor of each row: the last prompt token in a continuation, 1 in a corpus window
        first_anchor = (starts - 1).clamp(min=1)
        anchors = sample_anchors(b, t, n, recipe.num_anchors, gen, first_anchor).to(
            device
        )  # [b, K]
        out = teacher_forward(
            target, tokens
        )  # the whole batch: a tensor-parallel target needs it on every rank
        with torch.no_grad():
            aux = out.aux_hidden_states.view(b, t, -1)
            rows_t = teacher_rows(anchors, n)  # [b, K, B - 1]
            flat = (rows_t + torch.arange(b, device=device)[:, None, None] * t).reshape(-1)
            teacher = target.compute_logits(out.hidden_states[flat]).view(*rows_t.shape, -1)
        losses, top1 = objective(embed, aux[rows], tokens[rows], anchors[rows], teacher[rows])
        weights = position_weights(len(losses) + 1, recipe.loss_gamma)
        return weighted_loss(losses, weights), tokens.numel(), part_metrics("pos", losses, top1, 1)

    history = train(
        objective,
        loss_fn,
        recipe.loop_optim(t0),
        device,
        desc="dflash draft",
        resume=Resume(
            resume_dir / "state.pt", recipe.resume_every, gen, run_identity(recipe, target_dir)
        ),
        ranks=ranks,
    )

    positions = range(1, n)
    metrics = dict(
        common_metrics(recipe, draft, history, t0, device, ranks.size, target=target_dir),
        **data.corpus_metrics,
        checkpoint_mib=size_mib,
        final_position_loss={i: history.extra[f"loss pos {i}"][-1] for i in positions},
        final_position_top1={i: history.extra[f"top1 pos {i}"][-1] for i in positions},
        position_weights=position_weights(n, recipe.loss_gamma),
        target_num_layers=tcfg.num_hidden_layers,
        target_layer_ids=list(layer_ids),
        capture_layer_ids=list(cfg.capture_layer_ids),
        mask_token=mask_token,
        mask_token_id=mask_token_id,
    )
    state = {name: p.detach() for name, p in ranks.full_parameters(draft).items()}
    target = draft = objective = data = None  # the training state freed before the held-out run
    if ranks.is_driver:
        save_trained(
            out_dir,
            state,
            cfg_dict,
            history,
            "DFlash draft: block loss (CE vs the target, per position)",
            metrics,
            write_dflash_card,
            plotted_prefix="loss",
        )
        shutil.rmtree(resume_dir, ignore_errors=True)
    spec = SpeculativeConfig("dflash", str(out_dir), num_steps=n - 1)
    return finish_with_heldout(
        out_dir, target_dir, spec, recipe, metrics, write_dflash_card, device, t0, ranks=ranks
    )


def write_dflash_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import draft_train_command, write_model_card

    r = m["recipe"]
    n = r["block_size"]
    rows = "\n".join(
        f"| {i} | x(a+{i}) | {m['position_weights'][int(i) - 1]:.3f} | {m['final_position_loss'][i]:.4f} "
        f"| {m['final_position_top1'][i]:.4f} |"
        for i in sorted(m["final_position_top1"], key=int)
    )
    sampled = (
        "greedily (temperature 0)"
        if r["data_temperature"] == 0
        else f"at temperature {r['data_temperature']}"
    )
    corpus = (
        f", mixed with raw {window_source(r)} windows of the same length "
        f"({100 * r['corpus_fraction']:.0f}% of each batch)"
        if r["corpus_fraction"]
        else ""
    )
    soft = (
        f" plus {r['soft_label_weight']} x the soft cross-entropy against its distribution there"
        if r["soft_label_weight"]
        else ""
    )
    acceptance = heldout_section(m)
    sections = {
        "Data": f"""{r["num_continuations"]} continuations of {r["new_tokens"]} tokens that the target generated
{sampled} through outpace's engine after {r["prompt_len"]}-token prompts cut from {prompt_source(m)}{corpus},
{r["batch_size"]} windows of {r["prompt_len"] + r["new_tokens"]} tokens per batch. {unused_files_note(m)}""",
        "Block training": f"""The target runs once per batch (no gradient) and gives the outputs of its layers
{m["target_layer_ids"]} (outpace capture indices {m["capture_layer_ids"]}), concatenated and fused by `fc` +
`hidden_norm` into one context feature per row, and its logits. Each window gets {r["num_anchors"]} distinct
random anchors a in its continuation (from the last prompt token on); each anchor a block of {n} rows: the token
x(a) then {n - 1} `{m["mask_token"]}` tokens (id {m["mask_token_id"]}) at positions a .. a+{n - 1}, embedded with
the target's embedding. Every block row attends to the context features of rows < a and to every row of its own
block (non-causal), which is what the serving draft sees when x(a) is the bonus token. Block row i >= 1 learns
the target's own choice for position a+i (cross-entropy against the target's argmax at row a+i-1{soft}),
weighted by exp(-(i-1)/{r["loss_gamma"]}) and normalised by the weights' sum. On greedy continuations that label
is exactly what verification at temperature 0 accepts. The final norm starts as the
target's{"" if r["init_norm_from_target"] else " (not used: ones)"}. Final training loss: {m["final_loss"]:.4f}.

Last logged training batch, per block row (top-1: agreement with the target's argmax):

| row | predicts | weight | loss | top-1 |
|---|---|---|---|---|
{rows}""",
        "Checkpoint layout": f"""`DFlashDraftModel` in the public DFlash v1 format: `fc.weight`
({len(m["target_layer_ids"])} x target hidden -> hidden), `hidden_norm.weight`, `layers.{{i}}.*` ({r["num_layers"]}
Qwen3-style layers: `input_layernorm`, `self_attn.{{q,k,v,o}}_proj`, `self_attn.{{q,k}}_norm`,
`post_attention_layernorm`, `mlp.{{gate,up,down}}_proj`), `norm.weight`. No embedding and no head: the target's
are used. `dflash_config` = `{{"block_size": {n}, "mask_token_id": {m["mask_token_id"]}, "target_layer_ids":
{m["target_layer_ids"]}}}` (ids mean "output of layer X"), `num_target_layers` = {m["target_num_layers"]}.
bf16 weights: {m["checkpoint_mib"]:.2f} MiB. Serve with `--method dflash --num-steps {n - 1}`.""",
        "Held-out acceptance": acceptance,
    }
    write_model_card(
        out_dir,
        "tinypy-dflash: a DFlash block draft for tinypy",
        f"A {r['num_layers']}-layer block-diffusion draft that proposes {n - 1} tokens in one forward, "
        "for `--method dflash`.",
        draft_train_command("dflash", DFlashRecipe, m, "zoo/tinypy-dflash"),
        sections,
    )
