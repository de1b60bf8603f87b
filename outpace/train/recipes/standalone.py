"""``outpace train draft --method standalone``: a much smaller Llama with the target's tokenizer,
distilled from the target (soft labels) on the target's own continuations and on corpus text."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.checkpoint import model_state_dict
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.train.distill import (
    DistillRecipe,
    distillation_inputs,
    masked_cross_entropy,
    prompt_source,
    teacher_forward,
    unused_files_note,
    window_source,
)
from outpace.train.export import common_metrics, save_trained
from outpace.train.loop import train
from outpace.train.ranks import ONE_RANK, TrainRanks
from outpace.train.resume import Resume
from outpace.train.run_checks import check_run, run_identity
from outpace.train.target import init_weights

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class StandaloneRecipe(DistillRecipe):
    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 6
    num_kv_heads: int = 2
    batch_size: int = 64
    steps: int = 3000

    def __post_init__(self) -> None:
        super().__post_init__()
        check = self.check
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            check(name, getattr(self, name) >= 1, ">= 1")
        check(
            "hidden_size",
            self.hidden_size % self.num_heads == 0,
            f"a multiple of num_heads ({self.num_heads})",
        )
        check(
            "num_kv_heads",
            self.num_heads % self.num_kv_heads == 0,
            f"a divisor of num_heads ({self.num_heads})",
        )

    @classmethod
    def toy(cls, **overrides) -> StandaloneRecipe:
        return cls(
            **{
                **dict(
                    hidden_size=32,
                    intermediate_size=64,
                    num_layers=1,
                    num_heads=4,
                    num_kv_heads=2,
                    num_continuations=8,
                    prompt_len=8,
                    new_tokens=16,
                    batch_size=4,
                    steps=20,
                    lr=1e-2,
                    warmup_steps=2,
                    max_minutes=None,
                    max_corpus_bytes=300_000,
                ),
                **overrides,
            }
        )


def draft_config(target_cfg: dict, recipe: StandaloneRecipe) -> dict:
    cfg = dict(target_cfg)
    for key in ("num_nextn_predict_layers", "chain_mtp_hidden_states"):
        cfg.pop(key, None)
    cfg.update(
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
    )
    return cfg


def train_standalone(
    target_dir: Path,
    recipe: StandaloneRecipe,
    out_dir: Path,
    device: str,
    ranks: TrainRanks = ONE_RANK,
) -> dict:
    """Distil and save the draft; over several ``ranks`` (train/ranks.py) the target is tensor-parallel over
    them and gives the soft labels of the whole batch, and the draft (a model of its own, which reads no
    target state) trains data-parallel (FSDP), each rank taking its rows of every batch."""
    t0 = time.perf_counter()
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    check_run(recipe, target_dir, out_dir)
    resume_dir = (
        out_dir / "resume"
    )  # training state while the run lasts; removed once the draft is saved
    rows, data, target = distillation_inputs(target_dir, recipe, resume_dir, device, ranks)
    cfg_dict = draft_config(json.loads((target_dir / "config.json").read_text()), recipe)
    draft = build_model(ModelConfig.from_dict(cfg_dict), torch.float32, device)
    init_weights(draft, recipe.seed)
    objective = ranks.shard(
        draft,
        lambda d, tokens, teacher: masked_cross_entropy(
            d.compute_logits(draft_forward(d, tokens)), teacher, ranks=ranks
        )[0],
        recipe.compiles_on(device, ranks.size),
    )
    gen = torch.Generator().manual_seed(recipe.seed)  # every rank draws the same batches

    def loss_fn(step: int):
        tokens = data.batch(recipe.batch_size, gen).to(device)
        b, t = tokens.shape
        # the whole batch: a tensor-parallel target needs it on every rank
        teacher = target.compute_logits(teacher_forward(target, tokens).hidden_states).view(
            b, t, -1
        )  # [B, T, vocab]
        return objective(tokens[rows], teacher[rows].flatten(0, 1)), tokens.numel(), {}

    history = train(
        objective,
        loss_fn,
        recipe.loop_optim(t0),
        device,
        desc="standalone draft",
        resume=Resume(
            resume_dir / "state.pt", recipe.resume_every, gen, run_identity(recipe, target_dir)
        ),
        ranks=ranks,
    )
    state = model_state_dict(draft, ranks.full_parameters(draft))
    metrics = dict(
        common_metrics(recipe, draft, history, t0, device, ranks.size, target=target_dir),
        **data.corpus_metrics,
    )
    if ranks.is_driver:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            shutil.copy(target_dir / name, out_dir / name)
        save_trained(
            out_dir,
            state,
            cfg_dict,
            history,
            "standalone draft: distillation loss (soft CE vs target)",
            metrics,
            write_standalone_card,
        )
        shutil.rmtree(resume_dir, ignore_errors=True)
    return metrics


def draft_forward(draft: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """tokens [b, T] -> the draft's last pre-norm hidden states [b * T, hidden] (dense causal)."""
    b, t = tokens.shape
    with forward_context(DenseCausalMetadata(b, t)):
        return draft(
            tokens.reshape(-1), torch.arange(t, device=tokens.device).repeat(b)
        ).hidden_states


def write_standalone_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import draft_train_command, write_model_card

    r = m["recipe"]
    sections = {
        "Data": f"""{r["num_continuations"]} continuations of {r["new_tokens"]} tokens that the target
(zoo/tinypy) sampled at temperature 0.8 after {r["prompt_len"]}-token prompts cut from {prompt_source(m)},
mixed half and half with raw {window_source(r)} windows. The loss is the cross-entropy against the target's full
distribution at every position (soft labels). {unused_files_note(m)} Final training loss:
{m["final_loss"]:.4f}. The tokenizer is the target's."""
    }
    write_model_card(
        out_dir,
        "tinypy-draft: a standalone draft model for tinypy",
        "A much smaller Llama with the target's tokenizer, for `--method draft`.",
        draft_train_command("standalone", StandaloneRecipe, m, "zoo/tinypy-draft"),
        sections,
    )
