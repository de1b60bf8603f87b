"""``outpace train draft --method dflash``: a DFlash block-diffusion draft trained against the target's
soft labels.

Shapes follow the target (hidden size, heads, head_dim, intermediate size): the draft borrows the
target's embedding and head, so its checkpoint holds neither. It reads the outputs of a few target
layers spread over the depth (6 layers: outputs of layers 1, 3, 5), fused by ``fc`` + ``hidden_norm``.
The mask token is the target tokenizer's ``mask_token`` (the zoo's ``<|mask|>``, id 2).

Training, for token windows x [b, T] (the target runs once per batch, no gradient, and gives the
capture layers' states and its logits):
- per window, ``num_anchors`` distinct anchors a in [1, T - B + 1];
- per anchor, the block [x_a, mask x (B - 1)] at positions a .. a + B - 1 whose rows attend to the
  context features of rows < a and to the whole block (non-causal): exactly what the serving draft
  sees when x_a is the bonus token at position a. All anchors of a batch run in one dense attention
  with an explicit mask (``DFlashDraft.forward_dense``);
- block row i >= 1 is scored by the soft cross-entropy against the target's distribution for
  position a + i (its logits at row a + i - 1), weighted by exp(-(i - 1) / gamma) (DFlash's decay:
  early block positions decide acceptance), normalised by the sum of the weights.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from outpace.config import ModelConfig
from outpace.models.dflash import DFlashConfig, DFlashDraft, tokenizer_mask_token_id
from outpace.models.loader import default_dtype, load_model
from outpace.train.distill import DistillData, DistillRecipe, soft_cross_entropy, teacher_forward
from outpace.train.export import common_metrics, save_trained
from outpace.train.loop import train
from outpace.train.target import init_weights


@dataclass(frozen=True)
class DFlashRecipe(DistillRecipe):
    block_size: int = 8                           # B: B - 1 drafts per verify
    num_layers: int = 2
    intermediate_size: int | None = None          # None: the target's
    target_layer_ids: tuple[int, ...] | None = None  # "output of layer X"; None: default_target_layer_ids(L)
    num_anchors: int = 12                         # blocks per training window
    loss_gamma: float = 4.0                       # block row i weighs exp(-(i - 1) / gamma)
    init_norm_from_target: bool = True            # the final norm starts as the target's (its head follows)
    max_checkpoint_mib: float = 4.0               # bf16 size budget of the saved draft

    def __post_init__(self) -> None:
        def check(name: str, ok: bool, allowed: str) -> None:
            if not ok:
                raise ValueError(f"DFlashRecipe.{name}={getattr(self, name)!r} is invalid: must be {allowed}")

        check("block_size", self.block_size >= 2, ">= 2 (the bonus token and at least one mask)")
        check("num_layers", self.num_layers >= 1, ">= 1")
        check("num_anchors", self.num_anchors >= 1, ">= 1")
        check("loss_gamma", self.loss_gamma > 0, "> 0")
        check("batch_size", self.batch_size >= 2, ">= 2 (half continuations, half corpus windows)")
        check("new_tokens", self.seq_len - self.block_size + 1 >= self.num_anchors,
              f"such that prompt_len + new_tokens - block_size + 1 >= num_anchors ({self.num_anchors} distinct "
              "anchors per window)")

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.new_tokens

    @classmethod
    def toy(cls, **overrides) -> DFlashRecipe:
        """A CPU-sized recipe for tests: trains in seconds."""
        return cls(**{**dict(block_size=4, num_layers=1, num_anchors=4, num_continuations=8, prompt_len=8,
                             new_tokens=24, batch_size=4, steps=30, lr=1e-2, warmup_steps=2, max_minutes=None,
                             max_corpus_bytes=300_000), **overrides})


# ---------------------------------------------------------------------------------------------
# Config


def default_target_layer_ids(num_layers: int, count: int = 3) -> tuple[int, ...]:
    """``count`` target layers (output-of ids) spread from layer 1 to the last: 6 layers -> (1, 3, 5).
    Shallow targets get fewer distinct ids (3 layers -> (1, 2); 1 layer -> (0,))."""
    if num_layers < 2:
        return (0,)
    span = num_layers - 2
    return tuple(sorted({1 + round(k * span / max(count - 1, 1)) for k in range(count)}))


def dflash_config(target_cfg: ModelConfig, recipe: DFlashRecipe, target_layer_ids: tuple[int, ...],
                  mask_token_id: int) -> dict:
    """config.json in the public DFlash v1 format (``DFlashDraftModel``, Qwen3-style layers)."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": recipe.intermediate_size or target_cfg.intermediate_size,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
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
        "dflash_config": {"block_size": recipe.block_size, "mask_token_id": mask_token_id,
                          "target_layer_ids": list(target_layer_ids)},
    }
    if target_cfg.rope_scaling is not None:
        cfg["rope_scaling"] = target_cfg.rope_scaling
    return cfg


# ---------------------------------------------------------------------------------------------
# Blocks and the training forward


def sample_anchors(batch: int, seq_len: int, block_size: int, num_anchors: int,
                   generator: torch.Generator) -> torch.Tensor:
    """[batch, num_anchors] int64: distinct anchors per window in [1, seq_len - block_size + 1], sorted.

    Anchor a needs a context row (a >= 1) and the target's distribution for position a + B - 1,
    which is its logits at row a + B - 2 <= seq_len - 1.
    """
    num_choices = seq_len - block_size + 1
    picks = torch.rand(batch, num_choices, generator=generator).argsort(dim=1)[:, :num_anchors]
    return picks.sort(dim=1).values + 1


def block_inputs(tokens: torch.Tensor, anchors: torch.Tensor, block_size: int, mask_token_id: int):
    """Blocks for every anchor, flattened anchor-major.

    tokens [b, T], anchors [b, K] -> (block_ids [b, K * B], block_positions [b, K * B],
    mask [b, K * B, T + K * B] bool). Row (k, i) holds x_a (i = 0) or the mask token at position
    a_k + i, and may attend to context rows t < a_k and to every row of its own block.
    """
    b, t = tokens.shape
    k = anchors.shape[1]
    dev = tokens.device
    offsets = torch.arange(block_size, device=dev)
    positions = anchors[:, :, None] + offsets                                     # [b, K, B]
    ids = torch.full((b, k, block_size), mask_token_id, dtype=torch.int64, device=dev)
    ids[:, :, 0] = tokens.gather(1, anchors)
    context = torch.arange(t, device=dev)[None, None, :] < anchors[:, :, None]    # [b, K, T]
    context = context[:, :, None, :].expand(b, k, block_size, t).reshape(b, k * block_size, t)
    same_block = torch.arange(k, device=dev).repeat_interleave(block_size)        # [K * B] block of each row
    own = (same_block[:, None] == same_block[None, :]).expand(b, -1, -1)           # [b, K * B, K * B]
    return ids.reshape(b, -1), positions.reshape(b, -1), torch.cat([context, own], dim=2)


def dflash_forward(draft: DFlashDraft, embed: Callable[[torch.Tensor], torch.Tensor], aux: torch.Tensor,
                   tokens: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """aux [b, T, num_features * target_hidden], tokens [b, T], anchors [b, K] -> the block rows'
    pre-norm outputs [b, K, B, hidden] (row i of block k at position anchors[:, k] + i)."""
    cfg = draft.config
    b, t = tokens.shape
    ids, positions, mask = block_inputs(tokens, anchors, cfg.block_size, cfg.mask_token_id)
    context = draft.fuse(aux)  # [b, T, hidden]
    context_positions = torch.arange(t, device=tokens.device).expand(b, t)
    # NOTE: the residual stream starts in the draft's precision (fp32 masters under autocast), not the target's.
    hidden = draft.forward_dense(context, context_positions, embed(ids).to(context.dtype), positions, mask)
    return hidden.view(b, anchors.shape[1], cfg.block_size, -1)


def position_weights(block_size: int, gamma: float) -> list[float]:
    """Weight of block row i = 1 .. B - 1: exp(-(i - 1) / gamma)."""
    return [math.exp(-(i - 1) / gamma) for i in range(1, block_size)]


def block_losses(draft: DFlashDraft, hidden: torch.Tensor, teacher_logits: torch.Tensor):
    """hidden [b, K, B, hidden] from ``dflash_forward``; teacher_logits [b, K, B - 1, vocab] (the
    target's logits at rows a + i - 1, i = 1 .. B - 1) -> (losses, top-1 agreements) per block row i."""
    b, k, n, _ = hidden.shape
    student = draft.compute_logits(hidden[:, :, 1:].reshape(b * k * (n - 1), -1)).view(b, k, n - 1, -1)
    losses, top1 = [], []
    for i in range(n - 1):
        s, t = student[:, :, i].flatten(0, 1), teacher_logits[:, :, i].flatten(0, 1)
        losses.append(soft_cross_entropy(s, t))
        top1.append((s.argmax(-1) == t.argmax(-1)).float().mean().detach())
    return losses, top1


def weighted_loss(losses: list[torch.Tensor], gamma: float) -> torch.Tensor:
    weights = position_weights(len(losses) + 1, gamma)
    return sum(w * l for w, l in zip(weights, losses)) / sum(weights)


def teacher_rows(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """[b, K, B - 1]: the target row whose logits give the distribution for block row i (a + i - 1)."""
    return anchors[:, :, None] + torch.arange(block_size - 1, device=anchors.device)


# ---------------------------------------------------------------------------------------------
# The recipe


def train_dflash(target_dir: Path, recipe: DFlashRecipe, out_dir: Path, device: str) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    declared = tokenizer_mask_token_id(target_dir)
    if declared is None:
        raise ValueError(f"target {target_dir} has no tokenizer mask token (tokenizer_config.json mask_token): "
                         "a DFlash draft needs one for its block placeholders")
    mask_token, mask_token_id = declared
    data = DistillData.for_recipe(target_dir, recipe, device)
    target = load_model(target_dir, torch.bfloat16 if device.startswith("cuda") else torch.float32, device,
                        progress=False)
    target.requires_grad_(False)
    tcfg: ModelConfig = target.config
    layer_ids = tuple(recipe.target_layer_ids or default_target_layer_ids(tcfg.num_hidden_layers))
    bad = [i for i in layer_ids if not 0 <= i < tcfg.num_hidden_layers]
    if bad:
        raise ValueError(f"DFlashRecipe.target_layer_ids {list(layer_ids)}: layers {bad} are not in the target's "
                         f"0 .. {tcfg.num_hidden_layers - 1}")
    cfg_dict = dflash_config(tcfg, recipe, layer_ids, mask_token_id)
    cfg = DFlashConfig.from_dict(cfg_dict)
    target.set_aux_hidden_state_layers(cfg.capture_layer_ids)

    with default_dtype(torch.float32), torch.device(device):
        draft = DFlashDraft(cfg, tcfg.hidden_size)
    init_weights(draft, recipe.seed)
    if recipe.init_norm_from_target:
        with torch.no_grad():
            draft.norm.weight.copy_(target.model.norm.weight.float())
    draft.attach_target(target)
    num_parameters = sum(p.numel() for p in draft.parameters())
    size_mib = 2 * num_parameters / 2 ** 20
    if size_mib > recipe.max_checkpoint_mib:
        raise ValueError(f"the DFlash draft has {num_parameters:,} parameters ({size_mib:.2f} MiB in bf16), over "
                         f"DFlashRecipe.max_checkpoint_mib={recipe.max_checkpoint_mib}")
    gen = torch.Generator().manual_seed(recipe.seed)
    n = recipe.block_size

    def loss_fn(step: int):
        tokens = data.batch(recipe.batch_size, gen).to(device)
        b, t = tokens.shape
        anchors = sample_anchors(b, t, n, recipe.num_anchors, gen).to(device)
        out = teacher_forward(target, tokens)
        with torch.no_grad():
            aux = out.aux_hidden_states.view(b, t, -1)
            rows_t = teacher_rows(anchors, n)                                   # [b, K, B - 1]
            flat = (rows_t + torch.arange(b, device=device)[:, None, None] * t).reshape(-1)
            teacher = target.compute_logits(out.hidden_states[flat]).view(*rows_t.shape, -1)
        hidden = dflash_forward(draft, target.embed, aux, tokens, anchors)
        losses, top1 = block_losses(draft, hidden, teacher)
        extra = {**{f"loss pos {i + 1}": l.detach() for i, l in enumerate(losses)},
                 **{f"top1 pos {i + 1}": a for i, a in enumerate(top1)}}
        return weighted_loss(losses, recipe.loss_gamma), tokens.numel(), extra

    history = train(draft, loss_fn, recipe.optim, device, desc="dflash draft")

    positions = range(1, n)
    metrics = dict(
        common_metrics(recipe, draft, history, t0, device), checkpoint_mib=size_mib,
        final_position_loss={i: history.extra[f"loss pos {i}"][-1] for i in positions},
        final_position_top1={i: history.extra[f"top1 pos {i}"][-1] for i in positions},
        position_weights=position_weights(n, recipe.loss_gamma),
        target_num_layers=tcfg.num_hidden_layers, target_layer_ids=list(layer_ids),
        capture_layer_ids=list(cfg.capture_layer_ids), mask_token=mask_token, mask_token_id=mask_token_id)
    state = {name: p.detach() for name, p in draft.named_parameters()}
    return save_trained(out_dir, state, cfg_dict, history,
                        "DFlash draft: block loss (soft CE vs target, per position)", metrics, write_dflash_card,
                        plotted_prefix="loss")


TRAIN_COMMAND = ("python -m outpace train draft --method dflash --target zoo/tinypy --out zoo/tinypy-dflash "
                 "--device cuda --steps 6000 --max-minutes 5.0")


def write_dflash_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import write_model_card

    r = m["recipe"]
    n = r["block_size"]
    rows = "\n".join(f"| {i} | x(a+{i}) | {m['position_weights'][int(i) - 1]:.3f} | {m['final_position_loss'][i]:.4f} "
                     f"| {m['final_position_top1'][i]:.4f} |" for i in sorted(m["final_position_top1"], key=int))
    sections = {
        "Data": f"""{r['num_continuations']} continuations of {r['new_tokens']} tokens that the target sampled at
temperature 0.8 after {r['prompt_len']}-token prompts cut from the corpus's train split, mixed half and half with
raw train-split windows of the same length ({r['prompt_len'] + r['new_tokens']} tokens), {r['batch_size']}
windows per batch. Held-out files are never used.""",
        "Block training": f"""The target runs once per batch (no gradient) and gives the outputs of its layers
{m['target_layer_ids']} (outpace capture indices {m['capture_layer_ids']}), concatenated and fused by `fc` +
`hidden_norm` into one context feature per row, and its logits. Each window gets {r['num_anchors']} distinct
random anchors a; each anchor a block of {n} rows: the token x(a) then {n - 1} `{m['mask_token']}` tokens (id
{m['mask_token_id']}) at positions a .. a+{n - 1}, embedded with the target's embedding. Every block row attends
to the context features of rows < a and to every row of its own block (non-causal), which is what the serving
draft sees when x(a) is the bonus token. All anchors of a batch run in one dense attention with an explicit mask.
Block row i >= 1 predicts x(a+i): soft cross-entropy against the target's distribution for that position,
weighted by exp(-(i-1)/{r['loss_gamma']}) and normalised by the weights' sum. The final norm starts as the
target's{'' if r['init_norm_from_target'] else ' (not used: ones)'}. Final training loss: {m['final_loss']:.4f}.

Last logged training batch, per block row (top-1: agreement with the target's argmax):

| row | predicts | weight | loss | top-1 |
|---|---|---|---|---|
{rows}""",
        "Checkpoint layout": f"""`DFlashDraftModel` in the public DFlash v1 format: `fc.weight`
({len(m['target_layer_ids'])} x target hidden -> hidden), `hidden_norm.weight`, `layers.{{i}}.*` ({r['num_layers']}
Qwen3-style layers: `input_layernorm`, `self_attn.{{q,k,v,o}}_proj`, `self_attn.{{q,k}}_norm`,
`post_attention_layernorm`, `mlp.{{gate,up,down}}_proj`), `norm.weight`. No embedding and no head: the target's
are used. `dflash_config` = `{{"block_size": {n}, "mask_token_id": {m['mask_token_id']}, "target_layer_ids":
{m['target_layer_ids']}}}` (ids mean "output of layer X"), `num_target_layers` = {m['target_num_layers']}.
bf16 weights: {m['checkpoint_mib']:.2f} MiB. Serve with `--method dflash --num-steps {n - 1}`.""",
        "Acceptance": """Acceptance lengths are measured by outpace's engine on held-out prompts
(`--method dflash`), not by this training run; they are added here once measured.""",
    }
    write_model_card(out_dir, "tinypy-dflash: a DFlash block draft for tinypy",
                     f"A {r['num_layers']}-layer block-diffusion draft that proposes {n - 1} tokens in one forward, "
                     "for `--method dflash`.", TRAIN_COMMAND, sections)
