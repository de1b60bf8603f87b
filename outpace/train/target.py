"""``outpace train target``: a small Llama code model with chained MTP layers, trained from scratch.

Recipe: byte-level BPE on the train split of the corpus; a Llama (tied embeddings) trained on
random windows; ``num_mtp_layers`` DeepSeek-V3-style MTP layers trained jointly with an
auxiliary loss (total = main + mtp_loss_weight * mean over depths, as DeepSeek-V3 does). The MTP
layers are chained (Step-3.5-Flash): depth 1 consumes the target's last pre-norm hidden state,
depth k the pre-norm output of depth k-1; at row i depth k embeds token i+k and predicts token
i+k+1, at rotary position i.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.checkpoint import model_state_dict, save_checkpoint
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.train.corpus import Corpus, SourceFile, build_corpus, default_roots, heldout_prompts
from outpace.train.data import TokenStream
from outpace.train.export import MAX_SHARD_BYTES
from outpace.train.loop import OptimConfig, TrainHistory, plot_history, train
from outpace.train.run_checks import (
    check_field,
    check_field_types,
    check_out_dir,
    check_training_fields,
)
from outpace.train.tokenizer import (
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    save_tokenizer,
    special_token_ids,
    train_tokenizer,
)

# the smallest vocabulary train/tokenizer.py trains: its special tokens and the 256 byte symbols
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


@dataclass(frozen=True)
class TargetRecipe:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 640
    num_layers: int = 6
    num_heads: int = 8
    num_kv_heads: int = 4
    max_position_embeddings: int = 2048
    num_mtp_layers: int = 3
    chain_mtp: bool = True
    mtp_loss_weight: float = 0.3
    seq_len: int = 512
    batch_size: int = 64
    steps: int = 8000
    lr: float = 3e-3
    warmup_steps: int = 200
    max_minutes: float | None = 8.0
    seed: int = 0
    heldout_fraction: float = 0.05
    max_corpus_bytes: int | None = 150_000_000
    tokenizer_sample_bytes: int = 20_000_000
    eval_windows: int = 128

    def __post_init__(self) -> None:
        """Every field's type against its annotation (``check_field_types``), then its range, each refused by
        name at construction (``outpace train target --set FIELD=VALUE`` reaches every field)."""
        check_field_types(self)
        check_model_fields(self)
        check_field(
            self,
            "vocab_size",
            self.vocab_size >= MIN_VOCAB_SIZE,
            f">= {MIN_VOCAB_SIZE} (the tokenizer's special tokens and 256 byte symbols)",
        )
        check_field(
            self,
            "hidden_size",
            self.hidden_size % self.num_heads == 0 and self.hidden_size // self.num_heads % 2 == 0,
            f"a multiple of num_heads ({self.num_heads}) with an even head size (rotary embeddings)",
        )
        check_field(
            self,
            "num_mtp_layers",
            self.num_mtp_layers >= 1,
            ">= 1 (the loss trains the MTP layers; family_targets.py trains targets without them)",
        )
        check_field(self, "tokenizer_sample_bytes", self.tokenizer_sample_bytes >= 1, ">= 1")

    @classmethod
    def toy(cls, **overrides) -> TargetRecipe:
        """A CPU-sized recipe for tests: trains in seconds."""
        return cls(
            **{
                **dict(
                    vocab_size=400,
                    hidden_size=32,
                    intermediate_size=64,
                    num_layers=2,
                    num_heads=4,
                    num_kv_heads=2,
                    max_position_embeddings=256,
                    seq_len=32,
                    batch_size=8,
                    steps=40,
                    lr=1e-2,
                    warmup_steps=5,
                    max_minutes=None,
                    max_corpus_bytes=300_000,
                    tokenizer_sample_bytes=200_000,
                    eval_windows=8,
                ),
                **overrides,
            }
        )


def check_model_fields(r) -> None:
    """The ranges of the fields ``TargetRecipe`` and family_targets.py ``FamilyRecipe`` share (the model's shape,
    the data and the optimisation), each refused by name; a recipe checks its own fields after calling this."""
    for name in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "seq_len",
        "eval_windows",
    ):
        check_field(r, name, getattr(r, name) >= 1, ">= 1")
    check_training_fields(r)
    check_field(
        r,
        "num_kv_heads",
        r.num_heads % r.num_kv_heads == 0,
        f"a divisor of num_heads ({r.num_heads})",
    )
    check_field(
        r,
        "seq_len",
        r.seq_len <= r.max_position_embeddings,
        f"<= max_position_embeddings ({r.max_position_embeddings}): the model trains at positions up "
        "to seq_len",
    )
    check_field(r, "num_mtp_layers", r.num_mtp_layers >= 0, ">= 0")
    check_field(
        r,
        "mtp_loss_weight",
        math.isfinite(r.mtp_loss_weight) and r.mtp_loss_weight >= 0,
        "a finite number >= 0",
    )
    check_field(
        r,
        "heldout_fraction",
        0 < r.heldout_fraction < 1,
        "in (0, 1) (the held-out files evaluate the model, the others train it)",
    )
    check_field(
        r,
        "max_corpus_bytes",
        r.max_corpus_bytes is None or r.max_corpus_bytes >= 1,
        "None (the whole corpus) or >= 1",
    )


def check_target_out(out_dir: Path, roots=None, inputs: tuple = ()) -> None:
    """Before a target run reads its corpus: ``out_dir`` (run_checks.py ``check_out_dir``) must be a directory
    that can be written, or not exist yet, and none of the run's input directories (``inputs``, then the corpus
    roots, whose sources the model's files would be written among)."""
    corpus = tuple(
        ("the corpus root", root, "the model's files would be written among the corpus's sources")
        for root in (default_roots() if roots is None else roots)
    )
    check_out_dir(out_dir, (*inputs, *corpus))


def hf_config(recipe: TargetRecipe, eos_id: int, pad_id: int) -> dict:
    """A Llama config.json, plus the MTP fields (DeepSeek-V3's name, SGLang's chaining flag)."""
    from transformers import LlamaConfig

    cfg = LlamaConfig(
        vocab_size=recipe.vocab_size,
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.hidden_size // recipe.num_heads,
        max_position_embeddings=recipe.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    ).to_dict()
    cfg.update(
        architectures=["LlamaForCausalLM"],
        torch_dtype="bfloat16",
        rope_theta=10000.0,
        num_nextn_predict_layers=recipe.num_mtp_layers,
        chain_mtp_hidden_states=recipe.chain_mtp,
    )
    return cfg


def tokenizer_sample(files: list[SourceFile], max_bytes: int) -> list[str]:
    """Files spread over all packages (ordered by a hash of the path) up to ``max_bytes``."""
    ordered = sorted(files, key=lambda f: hashlib.sha256(f.rel_path.encode()).digest())
    texts, total = [], 0
    for f in ordered:
        if total >= max_bytes:
            break
        texts.append(f.text)
        total += len(f.text)
    return texts


def mtp_forward_losses(model, tokens: torch.Tensor, num_mtp: int, chain: bool):
    """tokens [batch, seq_len + num_mtp + 1] -> (losses, top-1 accuracies), each a list whose entry 0
    is the target's next-token prediction and entry k the MTP depth k.

    The main model reads tokens[:, :seq_len]; depth k (1-based) at row i consumes the depth k-1
    state at row i (chained) or the target's (not chained) and the embedding of token i+k
    (train/recipes/mtp.py ``mtp_chain``, the forward the MTP fine-tune recipe trains with).
    """
    from outpace.train.recipes.mtp import mtp_chain

    b, length = tokens.shape
    t = length - num_mtp - 1
    positions = torch.arange(t, device=tokens.device).repeat(b)  # [b * t]
    with forward_context(DenseCausalMetadata(b, t)):
        target_hidden = model(tokens[:, :t].reshape(-1), positions).hidden_states  # [b * t, hidden]
    layers = list(model.mtp_layers)[:num_mtp] if num_mtp else []  # (a Gemma target has none)
    all_logits = [
        model.compute_logits(target_hidden),
        *mtp_chain(model, layers, target_hidden, tokens, chain),
    ]
    losses, accs = [], []
    for k, logits in enumerate(all_logits):
        labels = tokens[:, k + 1 : t + k + 1].reshape(-1)
        losses.append(F.cross_entropy(logits, labels))
        accs.append((logits.argmax(-1) == labels).float().mean().detach())
    return losses, accs


@torch.no_grad()
def evaluate(
    model, windows: torch.Tensor, recipe: TargetRecipe, device: str, batch: int = 16
) -> dict:
    """Held-out loss of the target and teacher-forced top-1 accuracy of each MTP depth."""
    k = recipe.num_mtp_layers
    loss_sum, acc_sum, n = torch.zeros(k + 1), torch.zeros(k + 1), 0
    for i in range(0, windows.shape[0], batch):
        w = windows[i : i + batch].to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            losses, accs = mtp_forward_losses(model, w, k, recipe.chain_mtp)
        loss_sum += torch.stack(losses).float().cpu()
        acc_sum += torch.stack(accs).float().cpu()
        n += 1
    loss, acc = (loss_sum / n).tolist(), (acc_sum / n).tolist()
    return {
        "heldout_loss": loss[0],
        "heldout_top1": acc[0],
        "mtp_heldout_loss": {d: loss[d] for d in range(1, k + 1)},
        "mtp_heldout_top1": {d: acc[d] for d in range(1, k + 1)},
    }


def prepare_data(recipe: TargetRecipe, roots=None):
    """Corpus, tokenizer, train stream and held-out stream for a recipe."""
    corpus: Corpus = build_corpus(
        roots, heldout_fraction=recipe.heldout_fraction, max_total_bytes=recipe.max_corpus_bytes
    )
    tok = train_tokenizer(
        tokenizer_sample(corpus.train, recipe.tokenizer_sample_bytes), vocab_size=recipe.vocab_size
    )
    ids = special_token_ids(tok)
    train_stream = TokenStream.from_files(corpus.train, tok, ids[EOS_TOKEN])
    heldout_stream = TokenStream.from_files(corpus.heldout, tok, ids[EOS_TOKEN])
    return corpus, tok, train_stream, heldout_stream


def train_target(
    recipe: TargetRecipe, out_dir: Path, device: str, roots=None, num_samples: int = 4
) -> dict:
    """Train, evaluate and save the target (with its MTP layers) as a HF directory in ``out_dir``
    (checked first: ``check_target_out``)."""
    check_target_out(out_dir, roots)
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    corpus, tok, train_stream, heldout_stream = prepare_data(recipe, roots)
    ids = special_token_ids(tok)
    cfg_dict = hf_config(recipe, ids[EOS_TOKEN], ids[PAD_TOKEN])
    cfg = ModelConfig.from_dict(cfg_dict)
    history, model = run_target_training(recipe, cfg, train_stream, device)
    windows = heldout_stream.sequential_windows(
        recipe.seq_len + recipe.num_mtp_layers + 1, recipe.eval_windows
    )
    metrics = evaluate(model, windows, recipe, device)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model_state_dict(model), out_dir, MAX_SHARD_BYTES, dtype=torch.bfloat16)
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    save_tokenizer(tok, out_dir, model_max_length=recipe.max_position_embeddings)
    plot_history(history, out_dir / "loss.png", "tinypy target: training loss")
    metrics.update(
        recipe=dataclasses.asdict(recipe),
        corpus=corpus.stats(),
        train_tokens=len(train_stream),
        heldout_tokens=len(heldout_stream),
        num_parameters=sum(p.numel() for p in model.parameters()),
        train_wall_seconds=history.wall_seconds,
        total_wall_seconds=time.perf_counter() - t0,
        device=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        history=history.to_dict(),
        samples=sample_completions(
            out_dir, heldout_prompts(corpus, num_samples, prompt_chars=160), device
        ),
    )
    (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_target_card(out_dir, metrics)
    return metrics


TRAIN_COMMAND = (
    "python -m outpace train target --out zoo/tinypy --device cuda --steps 12000 --max-minutes 7.0"
)


def write_target_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import write_model_card

    c, r = m["corpus"], m["recipe"]
    depths = sorted(m["mtp_heldout_top1"], key=int)
    mtp_rows = "\n".join(
        f"| MTP depth {d} (token t+{int(d) + 1}) | {m['mtp_heldout_loss'][d]:.4f} | "
        f"{m['mtp_heldout_top1'][d]:.4f} |"
        for d in depths
    )
    sections = {
        "Data": f"""Python source files of the training machine's standard library and site-packages
({c["train_files"]:,} train files, {c["train_bytes"] / 1e6:.1f} MB; {m["train_tokens"]:,} tokens), deduplicated by
content. Files are split by a sha256 hash of their relative path: {c["heldout_files"]:,} held-out files
({m["heldout_tokens"]:,} tokens) never train anything and supply evaluation windows and prompts. Tokenizer:
byte-level BPE, {r["vocab_size"]} tokens, trained on the train split (`<|endoftext|>`=0 is EOS, `<|pad|>`=1,
`<|mask|>`=2 is reserved for DFlash drafts, then chat tokens `<|system|>` `<|user|>` `<|assistant|>`).""",
        "Held-out results": f"""{r["eval_windows"]} held-out windows of {r["seq_len"]} tokens, teacher-forced.

| head | loss (nats/token) | top-1 accuracy |
|---|---|---|
| target (token t+1) | {m["heldout_loss"]:.4f} | {m["heldout_top1"]:.4f} |
{mtp_rows}

MTP top-1 is measured against the true next tokens with true tokens fed to the chain: the first
figure of how much each lookahead depth can accept.""",
        "Checkpoint layout": f"""A `LlamaForCausalLM` checkpoint (tied embeddings) that transformers loads as is, ignoring
the MTP weights. `config.json` adds `num_nextn_predict_layers: {r["num_mtp_layers"]}` and
`chain_mtp_hidden_states: {str(r["chain_mtp"]).lower()}`. MTP layer k is stored DeepSeek-V3 style as
`model.layers.{{num_hidden_layers + k}}.*`: `enorm`, `hnorm` (RMSNorm of the next token's embedding and of the
incoming hidden state), `eh_proj` (2H -> H over their concatenation), then one decoder layer
(`input_layernorm`, `self_attn.{{q,k,v,o}}_proj`, `post_attention_layernorm`, `mlp.{{gate,up,down}}_proj`). Logits
use the target's final `model.norm` and (tied) head. Chained: layer 0 consumes the target's last pre-norm
hidden state, layer k the pre-norm output of layer k-1; at row i, layer k embeds token i+k+1 and predicts
token i+k+2.""",
    }
    write_model_card(
        out_dir,
        "tinypy: a small Python code model with 3 chained MTP layers",
        "The zoo target of outpace: the default `--model`, the model CI measures acceptance "
        "with, and the benchmark pair's target.",
        TRAIN_COMMAND,
        sections,
    )


def run_target_training(recipe: TargetRecipe, cfg: ModelConfig, stream: TokenStream, device: str):
    """The training itself (separate so a reproducibility check can rerun it on the same data)."""
    torch.manual_seed(recipe.seed)
    model = build_model(cfg, torch.float32, device)
    init_weights(model, recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    window = recipe.seq_len + recipe.num_mtp_layers + 1

    def loss_fn(step: int):
        batch = stream.windows(recipe.batch_size, window, gen).to(device, non_blocking=True)
        losses, _ = mtp_forward_losses(model, batch, recipe.num_mtp_layers, recipe.chain_mtp)
        main, mtp = losses[0], torch.stack(losses[1:]).mean()
        extra = {
            "main": main.detach(),
            **{f"mtp depth {k}": losses[k].detach() for k in range(1, len(losses))},
        }
        return main + recipe.mtp_loss_weight * mtp, batch.numel(), extra

    opt = OptimConfig(
        steps=recipe.steps,
        lr=recipe.lr,
        warmup_steps=recipe.warmup_steps,
        max_minutes=recipe.max_minutes,
    )
    history: TrainHistory = train(model, loss_fn, opt, device, desc="target")
    return history, model


def reproducibility_check(recipe: TargetRecipe, steps: int, device: str, out_dir: Path) -> dict:
    """Run the recipe's first ``steps`` steps twice with the same seed on the same data; write both
    loss curves (JSON + PNG overlay) and their largest difference."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--reproduce-steps {steps!r} is invalid: must be an integer >= 1")
    check_target_out(out_dir)
    recipe = dataclasses.replace(recipe, steps=steps, max_minutes=None)
    _, tok, stream, _ = prepare_data(recipe)
    ids = special_token_ids(tok)
    cfg = ModelConfig.from_dict(hf_config(recipe, ids[EOS_TOKEN], ids[PAD_TOKEN]))
    runs = [run_target_training(recipe, cfg, stream, device)[0] for _ in range(2)]
    diffs = [abs(a - b) for a, b in zip(runs[0].losses, runs[1].losses)]
    result = {
        "steps": runs[0].steps,
        "losses": [r.losses for r in runs],
        "max_abs_diff": max(diffs),
        "mean_abs_diff": sum(diffs) / len(diffs),
        "seed": recipe.seed,
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "target_reproducibility.json").write_text(json.dumps(result, indent=2) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, r in enumerate(runs):
        ax.plot(
            r.steps, r.losses, label=f"run {i + 1}", alpha=0.8, linestyle="-" if i == 0 else "--"
        )
    ax.set(
        xlabel="step",
        ylabel="training loss",
        title=f"tinypy recipe, seed {recipe.seed}, twice (max |diff| {max(diffs):.4f})",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "target_reproducibility.png", dpi=110)
    plt.close(fig)
    return result


def init_weights(model: torch.nn.Module, seed: int, std: float = 0.02) -> None:
    """Normal(0, std) for matrices and embeddings, ones for norms; residual outputs scaled down."""
    g = torch.Generator().manual_seed(seed)
    num_layers = sum(1 for n, _ in model.named_modules() if n.endswith("mlp"))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0) if "norm" in name else p.zero_()
                continue
            scale = (
                std / (2 * num_layers) ** 0.5
                if name.endswith(("o_proj.weight", "down_proj.weight"))
                else std
            )
            p.copy_(torch.randn(p.shape, generator=g) * scale)


def sample_completions(
    model_dir: Path, prompts: list[str], device: str, max_tokens: int = 64
) -> list[dict]:
    """Greedy completions of held-out prompts through outpace's own engine."""
    from outpace import LLM, SamplingParams

    llm = LLM(str(model_dir), device=device)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [{"prompt": p, "completion": o.text} for p, o in zip(prompts, outs)]
