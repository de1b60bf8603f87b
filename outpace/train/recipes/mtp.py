"""``outpace train draft --method mtp``: the target's own MTP layers fine-tuned, chained as they are
served, on the target's greedy continuations; everything else in the target stays as it is.

Served (speculative/drafters/mtp.py), MTP layer k (0-based) at row t reads the embedding of token t + k + 1 and a
hidden state for row t at rotary position t, and predicts token t + k + 2; the hidden state is layer
k - 1's pre-norm output at row t when chained (layer 0: the target's state at t, in the form the layer
reads: models/drafts/mtp.py ``target_state``), else the target's state at every layer. Training runs exactly
that over whole windows at once (``mtp_chain``: one dense causal forward per layer, each row attending to
its layer's rows 0..t as its KV cache holds them once those tokens are committed).

Why greedy continuations (``data_temperature`` 0, the data of the DFlash and EAGLE3 recipes,
train/distill.py): at temperature 0 layer k's draft is verified only after drafts 1..k were the target's
greedy tokens, and on the target's greedy continuation the tokens layer k reads are exactly those.
The label of layer k at row t is the target's distribution at row t + k + 1 (soft labels; or its argmax),
on response rows only. Half of each batch (``corpus_fraction`` 0.5) is raw corpus windows, every row
labelled, as for EAGLE3 (train/recipes/eagle3.py): the target's function over more text than its continuations. Depth k weighs ``depth_decay`` ** k, normalised (1.0: DeepSeek-V3's mean over
depths, arXiv 2412.19437 section 2.2; EAGLE-3's TTT uses 0.8).

The output directory is the target with its MTP tensors replaced: every other file and tensor is copied
as it is (names, shards, dtypes), so it serves with ``--model OUT --method mtp``.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.layers.decoder import unpack_projections
from outpace.train.distill import (
    TrajectoryDistillRecipe,
    decayed_weights,
    distillation_inputs,
    masked_cross_entropy,
    part_metrics,
    prompt_source,
    response_mask,
    teacher_forward,
    unused_files_note,
    weighted_loss,
)
from outpace.train.evaluate import finish_with_heldout, heldout_section
from outpace.train.export import common_metrics
from outpace.train.loop import TrainHistory, plot_history, train
from outpace.train.ranks import ONE_RANK, TrainRanks
from outpace.train.resume import Resume
from outpace.train.run_checks import check_run, run_identity

# Files of the target that describe the target itself, not the fine-tuned copy (its card, plot, metrics).
NOT_COPIED = ("README.md", "loss.png", "training_metrics.json")


@dataclass(frozen=True)
class MTPRecipe(TrajectoryDistillRecipe):
    num_layers: int | None = None  # fine-tune the first N MTP layers (None: all the target has)
    depth_decay: float = 1.0  # layer k weighs depth_decay ** k (normalised)
    soft_labels: bool = True  # False: cross-entropy against the target's argmax
    lr: float = 1e-3
    warmup_steps: int = 50
    corpus_fraction: float = 0.5  # raw corpus windows beside the greedy continuations
    max_minutes: float | None = 3.0
    compile_step: bool = (
        True  # H100, batch 128: 1.7x eager (benchmarks/results/train_compile); its check,
    )
    # tests/train/test_train_compile.py, passed on an H200 2026-11-28

    def __post_init__(self) -> None:
        super().__post_init__()
        check = self.check
        check("num_layers", self.num_layers is None or self.num_layers >= 1, "None or >= 1")
        check("depth_decay", self.depth_decay > 0, "> 0")


def mtp_chain(
    target, layers, target_hidden: torch.Tensor, tokens: torch.Tensor, chained: bool
) -> list[torch.Tensor]:
    """target_hidden [B * T, hidden] (the target's last pre-norm states over tokens[:, :T]); tokens [B, >= T]
    -> the logits [B * T, vocab] of the MTP ``layers`` 0 .. K - 1 (the target's first K): layer k at row t
    reads token t + k + 1 (token 0 past the given tokens: those rows never reach a loss) and predicts token
    t + k + 2, at position t. Each layer reads the target's state, embeds and computes logits in its own
    layout (models/drafts/mtp.py: outpace's layers use the target's pre-norm state, embedding and head; DeepSeek-V3's
    the post-norm state and their own embedding and shared head)."""
    b = tokens.shape[0]
    t = target_hidden.shape[0] // b
    positions = torch.arange(t, device=tokens.device).repeat(b)
    logits, h = [], None
    with forward_context(DenseCausalMetadata(b, t)):
        for k, layer in enumerate(layers):
            ids = tokens[:, k + 1 : k + 1 + t]
            ids = torch.nn.functional.pad(ids, (0, t - ids.shape[1]), value=0).reshape(-1)
            state = layer.target_state(target, target_hidden) if h is None or not chained else h
            # NOTE: the layer's own precision (fp32 masters when only the MTP layers train on a bf16 target)
            dtype = next(layer.parameters()).dtype
            h = layer(positions, ids, state.to(dtype), target)  # (the embedding cast to it)
            logits.append(layer.compute_logits(target, h))
    return logits


def depth_losses(
    logits: list[torch.Tensor],
    teacher: torch.Tensor,
    mask: torch.Tensor,
    soft: bool,
    ranks: TrainRanks = ONE_RANK,
):
    """logits from ``mtp_chain``; teacher [B, T, vocab] (the target's logits); mask [B, T] label rows ->
    (losses, top-1 agreements) per layer: layer k at row t against the target at row t + k + 1 (over several
    training ranks, this rank's shares of the means over all their rows)."""
    b, t, _ = teacher.shape
    losses, top1 = [], []
    for k, lg in enumerate(logits):
        rows = t - 1 - k
        student = lg.view(b, t, -1)[:, :rows].flatten(0, 1)
        keep = mask[:, 1 + k :].flatten()
        loss, agree = masked_cross_entropy(
            student, teacher[:, 1 + k :].flatten(0, 1), keep, soft, ranks
        )
        losses.append(loss)
        top1.append(agree)
    return losses, top1


def trainable_mtp(mtp_layers, num_layers: int) -> torch.nn.ModuleList:
    """The first ``num_layers`` of the target's MTP layers in fp32, trainable, their projections unpacked;
    embedding and head copies stay frozen (DeepSeek-V3 shares them with the main model)."""
    layers = torch.nn.ModuleList(list(mtp_layers)[:num_layers]).float()
    unpack_projections(layers)
    for name, p in layers.named_parameters():
        p.requires_grad_(not ("embed_tokens" in name or "shared_head.head" in name))
    return layers


def checkpoint_names(target, layers: torch.nn.ModuleList, target_dir: Path) -> dict[str, str]:
    """The trainable parameters of ``layers`` (names relative to it) -> the names the target's safetensors files
    store them under (the target's ``checkpoint_name`` of ``mtp_layers.{name}``; a parameter the layers share,
    Qwen3-Next's fc and norms, is named once). Called before training: a layout whose tensors could not be
    written back is refused at once, naming the tensors and the directory."""
    to_ckpt = getattr(target, "checkpoint_name", lambda name: name)
    names = {
        name: to_ckpt(f"mtp_layers.{name}")
        for name, p in layers.named_parameters()
        if p.requires_grad
    }
    stored: set[str] = set()
    for f in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as src:
            stored.update(src.keys())
    missing = sorted(set(names.values()) - stored)
    if missing:
        raise ValueError(
            f"the MTP tensors {missing[:4]} are not in {target_dir}'s safetensors files: this target's MTP "
            "layout cannot be written back, so nothing was trained"
        )
    return names


def write_target_copy(target_dir: Path, out_dir: Path, replaced: dict[str, torch.Tensor]) -> None:
    """out_dir = target_dir with the tensors in ``replaced`` (checkpoint names, each one the target stores:
    ``checkpoint_names``) swapped in, each in the dtype the target stored it in; all other files and tensors
    as they were."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in sorted(target_dir.iterdir()):
        if not f.is_file() or f.name in NOT_COPIED:
            continue
        if f.suffix != ".safetensors":
            shutil.copy(f, out_dir / f.name)
            continue
        with safe_open(str(f), "pt") as src:
            tensors = {}
            for name in src.keys():
                t = src.get_tensor(name)
                if name in replaced:
                    t = replaced[name].detach().to(device="cpu", dtype=t.dtype).contiguous()
                tensors[name] = t
            metadata = src.metadata()
        save_file(tensors, str(out_dir / f.name), metadata=metadata)


def train_mtp(
    target_dir: Path, recipe: MTPRecipe, out_dir: Path, device: str, ranks: TrainRanks = ONE_RANK
) -> dict:
    """Fine-tune the target's MTP layers, write the target copy and evaluate it.

    Over several ``ranks`` (train/ranks.py) the frozen trunk is tensor-parallel over them, as for EAGLE3 and
    DFlash, and the MTP layers train data-parallel (FSDP), each rank taking its rows of every batch. Not
    tensor-parallel in place: outpace's sharded layers are built for serving and their collectives carry no
    gradient; and the MTP layers (one decoder layer each) are small next to the trunk, so each rank trains a
    whole copy read from the checkpoint (``TrainRanks.whole``), FSDP sharding its weights and moments, over
    the target's embedding and head whole on each rank (``TrainRanks.row_local``)."""
    t0 = time.perf_counter()
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    check_run(recipe, target_dir, out_dir)
    available = mtp_layer_count(target_dir)
    # refused before any data is generated (``_fine_tune`` checks the loaded target again)
    if available == 0:
        raise ValueError(
            f"--method mtp fine-tunes the target's MTP layers: {target_dir} has none "
            "(num_nextn_predict_layers = 0)"
        )
    if available is not None and (recipe.num_layers or available) > available:
        raise ValueError(
            f"MTPRecipe.num_layers={recipe.num_layers} is invalid: the target has {available} MTP layers"
        )
    resume_dir = out_dir / "resume"
    replaced, history, metrics = _fine_tune(target_dir, recipe, resume_dir, device, t0, ranks)
    if ranks.is_driver:
        write_target_copy(target_dir, out_dir, replaced)
        plot_history(
            _losses_only(history),
            out_dir / "loss.png",
            "MTP layers: loss (CE vs the target, per layer)",
        )
        (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        write_mtp_card(out_dir, metrics)
        shutil.rmtree(resume_dir, ignore_errors=True)
    spec = SpeculativeConfig("mtp", num_steps=metrics["num_mtp_layers"])
    return finish_with_heldout(
        out_dir,
        out_dir,
        spec,
        recipe,
        metrics,
        write_mtp_card,
        device,
        t0,
        prompts_near=target_dir,
        ranks=ranks,
    )


def mtp_layer_count(target_dir: Path) -> int | None:
    """How many MTP layers the target in ``target_dir`` serves, from its config and tensor names (the model
    class built on the meta device, as ``load_model`` builds it: a family may count its MTP layers in its own
    config field, or only in a layout its tensors show); None when that cannot be told without loading it."""
    from outpace.checkpoint import checkpoint_tensor_names
    from outpace.model_config import ModelConfig
    from outpace.models.drafts.mtp import has_own_mtp_heads
    from outpace.models.loader import build_model

    try:
        cfg = ModelConfig.from_pretrained(target_dir)
        own_heads = has_own_mtp_heads(cfg, checkpoint_tensor_names(target_dir))
        model = build_model(cfg, torch.float32, "meta", own_heads)
    except Exception:  # (quantized layouts and the like: ``_fine_tune`` checks the loaded target)
        return None
    return model.config.num_nextn_predict_layers


def _fine_tune(
    target_dir: Path,
    recipe: MTPRecipe,
    resume_dir: Path,
    device: str,
    started: float,
    ranks: TrainRanks,
) -> tuple[dict[str, torch.Tensor], TrainHistory, dict]:
    """The training of ``train_mtp``: (the trained tensors under their checkpoint names, whole on every rank;
    the history; the metrics). The target is freed when it returns, before the held-out engines start."""
    rows, data, target = distillation_inputs(target_dir, recipe, resume_dir, device, ranks)
    cfg = target.config
    available = cfg.num_nextn_predict_layers
    if not available:
        raise ValueError(
            f"--method mtp fine-tunes the target's MTP layers: {target_dir} has none "
            "(num_nextn_predict_layers = 0)"
        )
    n = recipe.num_layers or available
    if n > available:
        raise ValueError(
            f"MTPRecipe.num_layers={n} is invalid: the target has {available} MTP layers"
        )
    layers = trainable_mtp(ranks.whole(target, "mtp_layers"), n)
    names = checkpoint_names(target, layers, target_dir)
    chained = bool(cfg.chain_mtp_hidden_states or layers[0].chained_by_layout)
    local = ranks.row_local(target)
    objective = ranks.shard(
        layers,
        lambda mtp, hidden, tokens, teacher, mask: depth_losses(
            mtp_chain(local, mtp, hidden, tokens, chained), teacher, mask, recipe.soft_labels, ranks
        ),
        recipe.compiles_on(device, ranks.size),
    )
    gen = torch.Generator().manual_seed(recipe.seed)  # every rank draws the same batches

    def loss_fn(step: int):
        tokens, starts = data.batch_with_starts(recipe.batch_size, gen)
        tokens, starts = tokens.to(device), starts.to(device)
        b, t = tokens.shape
        hidden = teacher_forward(
            target, tokens
        ).hidden_states  # the whole batch: a tensor-parallel target needs it
        with torch.no_grad():
            teacher = target.compute_logits(hidden).view(b, t, -1)[rows]  # [b, T, vocab]
        mine = hidden.view(b, t, -1)[rows].flatten(0, 1)  # [b * T, hidden] pre-norm
        losses, top1 = objective(mine, tokens[rows], teacher, response_mask(starts[rows], t))
        weights = decayed_weights(len(losses), recipe.depth_decay)
        return weighted_loss(losses, weights), tokens.numel(), part_metrics("layer", losses, top1)

    history = train(
        objective,
        loss_fn,
        recipe.loop_optim(started),
        device,
        desc="mtp layers",
        resume=Resume(
            resume_dir / "state.pt", recipe.resume_every, gen, run_identity(recipe, target_dir)
        ),
        ranks=ranks,
    )

    replaced = {
        names[name]: p.detach()
        for name, p in ranks.full_parameters(layers).items()
        if name in names
    }
    metrics = dict(
        common_metrics(recipe, layers, history, started, device, ranks.size, target=target_dir),
        **data.corpus_metrics,
        num_mtp_layers=n,
        chained=chained,
        final_layer_loss={k: history.extra[f"loss layer {k}"][-1] for k in range(n)},
        final_layer_top1={k: history.extra[f"top1 layer {k}"][-1] for k in range(n)},
        replaced_tensors=len(replaced),
    )
    return replaced, history, metrics


def _losses_only(history):
    import dataclasses

    return dataclasses.replace(
        history, extra={k: v for k, v in history.extra.items() if k.startswith("loss")}
    )


def write_mtp_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import draft_train_command, shown_target, write_model_card

    r = m["recipe"]
    rows = "\n".join(
        f"| {k} | x(t+{int(k) + 2}) | {r['depth_decay'] ** int(k):.3f} | {m['final_layer_loss'][k]:.4f} "
        f"| {m['final_layer_top1'][k]:.4f} |"
        for k in sorted(m["final_layer_top1"], key=int)
    )
    sampled = (
        "greedily (temperature 0)"
        if r["data_temperature"] == 0
        else f"at temperature {r['data_temperature']}"
    )
    labels = (
        "soft cross-entropy against the target's distribution"
        if r["soft_labels"]
        else "cross-entropy against the target's argmax"
    )
    sections = {
        "Data": f"""{r["num_continuations"]} continuations that the target generated {sampled} through outpace's
engine after prompts of up to {r["prompt_len"]} tokens from {prompt_source(m)}, {r["batch_size"]} windows of
{r["prompt_len"] + r["new_tokens"]} tokens per batch. {unused_files_note(m)}""",
        "Fine-tuning": f"""The target ({shown_target(m["target"])}) runs once per batch (no gradient) and gives its last
hidden states and logits; its first {m["num_mtp_layers"]} MTP layers then run
{"chained (layer k reads layer k-1 output)" if m["chained"] else "each on the target state"} over the whole window
as served: layer k at row t reads token t+k+1 and predicts token t+k+2. Loss per layer: {labels} at that
position, response rows only; layer k weighs {r["depth_decay"]}^k (normalised). Only the MTP layers change
({m["replaced_tensors"]} tensors); every other file and tensor of the target is copied as it was.

| layer | predicts | weight | loss | top-1 |
|---|---|---|---|---|
{rows}""",
        "Held-out acceptance": heldout_section(m),
    }
    write_model_card(
        out_dir,
        f"{out_dir.name}: the target with its MTP layers fine-tuned",
        "Serve with `--model` this directory and `--method mtp`.",
        draft_train_command("mtp", MTPRecipe, m, "OUT"),
        sections,
    )
