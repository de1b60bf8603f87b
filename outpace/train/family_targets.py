"""Zoo targets of other families, trained from scratch on the zoo corpus with the zoo tokenizer:
``tinyds`` (DeepSeek-V3 architecture: MLA, sigmoid-routed MoE with one shared expert, two chained MTP
layers in DeepSeek's checkpoint layout) and ``tinygemma`` (Gemma 3: sandwich norms, q/k norms, GELU-tanh,
sliding-window layers interleaved with global ones). Both are outpace's own model classes
(models/deepseek.py, models/gemma.py) trained as they serve, saved as Hugging Face directories whose
config.json names DeepseekV3ForCausalLM / Gemma3ForCausalLM (transformers' config classes write them).

Shared with the tinypy recipe (train/target.py): the corpus split, the loss (main + mtp_loss_weight x
mean over MTP depths; ``mtp_forward_losses``), held-out evaluation, the loop (train/loop.py) and the
greedy samples. What the families add:
- DeepSeek-V3's MTP layers carry their own ``embed_tokens`` and ``shared_head.head``; DeepSeek-V3 shares
  both with the main model in training ("the embedding layer and the output head are shared", DeepSeek-V3
  technical report, arXiv 2412.19437, section 2.2), so they are tied to the target's here and written
  as copies under each MTP layer's names, as DeepSeek ships them;
- the experts are balanced without an auxiliary loss, as DeepSeek-V3 does (same report, section 2.1.2):
  after each step every routed expert's ``e_score_correction_bias`` moves by ``bias_update_speed``
  towards the mean load (up when underloaded, down when overloaded); the bias selects experts only;
- Gemma's norms scale by (1 + weight), so they start at weight 0 (scale 1).

Run: ``python -m outpace.train.family_targets tinyds --out zoo/tinyds`` (``--help`` for the options).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from outpace.checkpoint import save_checkpoint
from outpace.config import ModelConfig
from outpace.layers.moe import Router
from outpace.layers.norm import Float32RMSNorm
from outpace.models.loader import build_model
from outpace.train.corpus import build_corpus, heldout_prompts
from outpace.train.data import TokenStream
from outpace.train.export import MAX_SHARD_BYTES
from outpace.train.loop import OptimConfig, plot_history, train
from outpace.train.target import evaluate, init_weights, mtp_forward_losses, sample_completions
from outpace.train.tokenizer import EOS_TOKEN, PAD_TOKEN, save_tokenizer, special_token_ids
from outpace.zoo import TARGET, zoo_dir

DEEPSEEK, GEMMA = "DeepseekV3ForCausalLM", "Gemma3ForCausalLM"


@dataclass(frozen=True)
class FamilyRecipe:
    architecture: str
    hidden_size: int
    intermediate_size: int          # DeepSeek: the dense layers' MLP
    num_layers: int
    num_heads: int
    # DeepSeek-V3 (MLA, MoE, MTP)
    q_lora_rank: int | None = None
    kv_lora_rank: int = 32
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16
    n_routed_experts: int = 8
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    moe_intermediate_size: int = 64
    n_shared_experts: int = 1
    first_k_dense_replace: int = 1
    bias_update_speed: float = 1e-3
    num_mtp_layers: int = 0
    chain_mtp: bool = True
    mtp_loss_weight: float = 0.3
    # Gemma 3
    num_kv_heads: int = 1
    head_dim: int = 32
    sliding_window: int = 128
    sliding_window_pattern: int = 3  # every 3rd layer global
    # data and optimisation
    vocab_size: int = 4096          # the zoo tokenizer's
    max_position_embeddings: int = 2048
    seq_len: int = 256
    batch_size: int = 8
    steps: int = 3000
    lr: float = 3e-3
    warmup_steps: int = 30
    max_minutes: float | None = 13.0
    seed: int = 0
    heldout_fraction: float = 0.05
    max_corpus_bytes: int | None = 30_000_000
    eval_windows: int = 32

    @property
    def is_deepseek(self) -> bool:
        return self.architecture == DEEPSEEK

    def toy(self, **overrides) -> FamilyRecipe:
        """This family in a CPU-sized shape for tests (seconds)."""
        small = dict(hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, moe_intermediate_size=16,
                     n_routed_experts=4, n_group=2, topk_group=1, head_dim=16, sliding_window=8, seq_len=32,
                     batch_size=4, steps=20, warmup_steps=2, max_minutes=None, max_corpus_bytes=300_000,
                     eval_windows=4)
        return dataclasses.replace(self, **{**small, **overrides})


RECIPES = {
    "tinyds": FamilyRecipe(DEEPSEEK, hidden_size=64, intermediate_size=192, num_layers=4, num_heads=4,
                           q_lora_rank=48, num_mtp_layers=2),
    "tinygemma": FamilyRecipe(GEMMA, hidden_size=128, intermediate_size=256, num_layers=6, num_heads=4,
                              num_kv_heads=1, head_dim=32),
}


def hf_config(r: FamilyRecipe, eos_id: int, pad_id: int) -> dict:
    """config.json through transformers' own config class of the family."""
    import transformers

    common = dict(vocab_size=r.vocab_size, hidden_size=r.hidden_size, intermediate_size=r.intermediate_size,
                  num_hidden_layers=r.num_layers, num_attention_heads=r.num_heads,
                  max_position_embeddings=r.max_position_embeddings, tie_word_embeddings=True,
                  bos_token_id=None, eos_token_id=eos_id, pad_token_id=pad_id)
    if r.is_deepseek:
        cfg = transformers.DeepseekV3Config(
            **common, num_key_value_heads=r.num_heads, q_lora_rank=r.q_lora_rank, kv_lora_rank=r.kv_lora_rank,
            qk_nope_head_dim=r.qk_nope_head_dim, qk_rope_head_dim=r.qk_rope_head_dim, v_head_dim=r.v_head_dim,
            n_routed_experts=r.n_routed_experts, num_experts_per_tok=r.num_experts_per_tok, n_group=r.n_group,
            topk_group=r.topk_group, moe_intermediate_size=r.moe_intermediate_size,
            n_shared_experts=r.n_shared_experts, first_k_dense_replace=r.first_k_dense_replace,
            norm_topk_prob=True, routed_scaling_factor=1.0, rms_norm_eps=1e-6,
            num_nextn_predict_layers=r.num_mtp_layers).to_dict()
        # DeepSeek's own config.json fields (transformers' class omits them; models/deepseek.py DEFAULTS)
        cfg.update(num_nextn_predict_layers=r.num_mtp_layers, scoring_func="sigmoid", topk_method="noaux_tc")
    else:
        types = ["full_attention" if (i + 1) % r.sliding_window_pattern == 0 else "sliding_attention"
                 for i in range(r.num_layers)]
        cfg = transformers.Gemma3TextConfig(
            **common, num_key_value_heads=r.num_kv_heads, head_dim=r.head_dim, query_pre_attn_scalar=r.head_dim,
            sliding_window=r.sliding_window, layer_types=types, final_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6).to_dict()
    cfg.update(architectures=[r.architecture], torch_dtype="bfloat16")
    return cfg


def build_target(r: FamilyRecipe, cfg: ModelConfig, device: str) -> torch.nn.Module:
    """The model, initialised as tinypy's (train/target.py init_weights), Gemma's offset norms at 0 and each
    DeepSeek MTP layer's embedding and head tied to the target's (module docstring)."""
    torch.manual_seed(r.seed)
    model = build_model(cfg, torch.float32, device, mtp_own_heads=r.num_mtp_layers > 0)
    init_weights(model, r.seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Float32RMSNorm) and m.offset == 1.0:
                m.weight.zero_()
    for layer in getattr(model, "mtp_layers", ()):
        layer.embed_tokens.weight = model.model.embed_tokens.weight
        layer.shared_head.head.weight = model.lm_head.weight
    return model


class ExpertBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing (module docstring): records each router's choices in a
    forward and, on ``step``, moves every correction bias by ``speed`` towards balance."""

    def __init__(self, model: torch.nn.Module, speed: float) -> None:
        self.speed = speed
        self.routers = [m for m in model.modules() if isinstance(m, Router) and m.routing.correction_bias]
        self.loads: dict[Router, torch.Tensor] = {}
        for router in self.routers:
            router.register_forward_hook(self._record)

    def _record(self, router: Router, _inputs, output) -> None:
        if router.training:
            counts = torch.bincount(output[1].flatten(), minlength=router.routing.num_experts).float()
            self.loads[router] = self.loads.get(router, 0) + counts

    @torch.no_grad()
    def step(self) -> float:
        """Update the biases from the loads since the last step; returns the largest load / mean load."""
        worst = 1.0
        for router, load in self.loads.items():
            router.e_score_correction_bias += self.speed * torch.sign(load.mean() - load)
            worst = max(worst, float(load.max() / load.mean().clamp(min=1)))
        self.loads.clear()
        return worst


def checkpoint_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor under its checkpoint name: parameters in bf16 (a tied one under each of its names, so the
    MTP layers' embedding and head copies appear as DeepSeek ships them; the target's tied head once, as
    its embedding), the routers' correction biases in float32 (as DeepSeek-V3's checkpoints keep them)."""
    name = model.checkpoint_name
    out = {name(n): p.detach().to(torch.bfloat16) for n, p in model.named_parameters(remove_duplicate=False)
           if not n.startswith("lm_head.") or not model.config.tie_word_embeddings}
    out.update({name(n): b.detach().float() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")})
    return out


def prepare_data(r: FamilyRecipe, tokenizer_dir: Path, roots=None):
    """The zoo corpus split, tokenized with the zoo tokenizer: (corpus, tokenizer, train, held-out)."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    corpus = build_corpus(roots, heldout_fraction=r.heldout_fraction, max_total_bytes=r.max_corpus_bytes)
    eos = special_token_ids(tok)[EOS_TOKEN]
    return corpus, tok, TokenStream.from_files(corpus.train, tok, eos), TokenStream.from_files(corpus.heldout, tok, eos)


def train_family_target(r: FamilyRecipe, out_dir: Path, device: str = "cpu", tokenizer_dir: Path | None = None,
                        roots=None, num_samples: int = 2, command: str = "") -> dict:
    t0 = time.perf_counter()
    corpus, tok, stream, heldout = prepare_data(r, Path(tokenizer_dir or zoo_dir() / TARGET), roots)
    ids = special_token_ids(tok)
    cfg_dict = hf_config(r, ids[EOS_TOKEN], ids[PAD_TOKEN])
    model = build_target(r, ModelConfig.from_dict(cfg_dict), device)
    balancer = ExpertBalancer(model, r.bias_update_speed)
    gen = torch.Generator().manual_seed(r.seed)
    window = r.seq_len + r.num_mtp_layers + 1

    def loss_fn(step: int):
        balancer.step()  # the loads of the previous step's forward
        batch = stream.windows(r.batch_size, window, gen).to(device)
        losses, _ = mtp_forward_losses(model, batch, r.num_mtp_layers, r.chain_mtp)
        extra = {"main": losses[0].detach(), **{f"mtp depth {k}": losses[k].detach() for k in range(1, len(losses))}}
        mtp = torch.stack(losses[1:]).mean() if len(losses) > 1 else 0.0
        return losses[0] + r.mtp_loss_weight * mtp, batch.numel(), extra

    history = train(model, loss_fn, OptimConfig(steps=r.steps, lr=r.lr, warmup_steps=r.warmup_steps,
                                                max_minutes=r.max_minutes), device, desc=r.architecture)
    imbalance = balancer.step()
    windows = heldout.sequential_windows(window, r.eval_windows)
    metrics = evaluate(model, windows, r, device, batch=8)

    out_dir = Path(out_dir)
    save_checkpoint(checkpoint_tensors(model), out_dir, MAX_SHARD_BYTES)
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    save_tokenizer(tok, out_dir, model_max_length=r.max_position_embeddings)
    plot_history(history, out_dir / "loss.png", f"{out_dir.name}: training loss")
    metrics.update(
        recipe=dataclasses.asdict(r), corpus=corpus.stats(), train_tokens=len(stream), heldout_tokens=len(heldout),
        num_parameters=sum(p.numel() for p in model.parameters()), train_wall_seconds=history.wall_seconds,
        steps_run=history.total_steps, tokens_seen=history.tokens_seen, last_expert_load_max_over_mean=imbalance,
        device=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu", history=history.to_dict(),
        samples=sample_completions(out_dir, heldout_prompts(corpus, num_samples, prompt_chars=160), device),
        command=command)
    metrics["total_wall_seconds"] = time.perf_counter() - t0
    (out_dir / "training_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_family_card(out_dir)
    return metrics


def write_family_card(out_dir: Path) -> None:
    """README.md from training_metrics.json: recipe, command, wall time, data, held-out figures, layout."""
    from outpace.train.model_card import write_model_card

    out_dir = Path(out_dir)
    m = json.loads((out_dir / "training_metrics.json").read_text())
    r, c = m["recipe"], m["corpus"]
    mtp_rows = "".join(f"| MTP depth {d} (token t+{int(d) + 1}) | {m['mtp_heldout_loss'][d]:.4f} | "
                       f"{m['mtp_heldout_top1'][d]:.4f} |\n" for d in sorted(m["mtp_heldout_top1"], key=int))
    data = f"""The zoo corpus (train/corpus.py: Python files of the training machine's stdlib and site-packages, the
first {r['max_corpus_bytes'] / 1e6:.0f} MB; {c['train_files']:,} train files, {m['train_tokens']:,} tokens) with the zoo
tokenizer (tinypy's byte-level BPE, {r['vocab_size']} tokens). Files whose path hash puts them in the
{r['heldout_fraction']:.0%} held-out side ({c['heldout_files']:,} files) never train anything. {m['steps_run']} steps of
{r['batch_size']} random windows of {r['seq_len']} tokens: {m['tokens_seen']:,} tokens seen, on a shared 2-core CPU."""
    heldout = f"""{r['eval_windows']} held-out windows of {r['seq_len']} tokens, teacher-forced.

| head | loss (nats/token) | top-1 accuracy |
|---|---|---|
| target (token t+1) | {m['heldout_loss']:.4f} | {m['heldout_top1']:.4f} |
{mtp_rows}"""
    if r["architecture"] == DEEPSEEK:
        n = r["num_layers"]
        layout = f"""`DeepseekV3ForCausalLM` as transformers and DeepSeek name its tensors (tied embedding and head).
Layers 0..{r['first_k_dense_replace'] - 1} have a dense MLP, the others an MoE of {r['n_routed_experts']} routed experts
(top {r['num_experts_per_tok']}, sigmoid scores, {r['n_group']} groups of which {r['topk_group']} are kept, normalised
weights) plus {r['n_shared_experts']} shared expert, `mlp.experts.{{e}}.{{gate,up,down}}_proj` as DeepSeek's checkpoints
store them; `mlp.gate.e_score_correction_bias` (float32) is the bias the auxiliary-loss-free balancing learned (last
step's busiest expert had {m['last_expert_load_max_over_mean']:.2f}x the mean load). MLA: q_lora_rank
{r['q_lora_rank']}, kv_lora_rank {r['kv_lora_rank']}, qk_nope/rope/v head dims {r['qk_nope_head_dim']}/{r['qk_rope_head_dim']}/{r['v_head_dim']}.
The {r['num_mtp_layers']} MTP layers are `model.layers.{n}` and `model.layers.{n + 1}` in DeepSeek-V3's layout: `enorm`,
`hnorm`, `eh_proj`, `embed_tokens`, `shared_head.{{norm,head}}` beside an MoE decoder block. They were trained chained
(layer 0 reads the target's post-norm state, layer 1 layer 0's pre-norm output; at row i layer k embeds token i+k+1,
position 0's embedding zeroed, and predicts token i+k+2), with embedding and head tied to the target's as DeepSeek-V3
trains them; the checkpoint holds each copy."""
    else:
        layout = f"""`Gemma3ForCausalLM` as transformers names its tensors (tied embedding, scaled by sqrt(hidden) on lookup).
{r['num_layers']} layers, every {r['sliding_window_pattern']}rd global (`layer_types`), the others sliding over
{r['sliding_window']} tokens; {r['num_heads']} query heads, {r['num_kv_heads']} kv head, head_dim {r['head_dim']},
query_pre_attn_scalar {r['head_dim']}, (1 + w) RMSNorms (four per layer, q/k norms), GELU-tanh MLP, no logit softcapping."""
    title = f"{out_dir.name}: a small {r['architecture'].removesuffix('ForCausalLM')}-architecture code model"
    write_model_card(out_dir, title, "A zoo target of outpace for its model family (train/family_targets.py).",
                     m.get("command") or f"python -m outpace.train.family_targets {out_dir.name} --out zoo/{out_dir.name}",
                     {"Data": data, "Held-out results": heldout, "Checkpoint layout": layout})


def parse_budget_args(p: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, dict]:
    """Add the training-budget options the family scripts share (--device, --steps, --max-minutes,
    --threads), parse, set the CPU threads, and return (the arguments, the recipe fields they override)."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--threads", type=int, help="torch CPU threads")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    return a, {k: v for k, v in (("steps", a.steps), ("max_minutes", a.max_minutes)) if v is not None}

def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m outpace.train.family_targets", description=__doc__.split("\n")[0])
    p.add_argument("name", choices=sorted(RECIPES))
    p.add_argument("--out", required=True)
    a, overrides = parse_budget_args(p, argv)
    recipe = dataclasses.replace(RECIPES[a.name], **overrides)
    command = "python -m outpace.train.family_targets " + " ".join(sys.argv[1:] if argv is None else argv)
    metrics = train_family_target(recipe, Path(a.out), a.device, command=command)
    print(json.dumps({k: metrics[k] for k in ("heldout_loss", "heldout_top1", "mtp_heldout_top1", "train_wall_seconds",
                                              "steps_run", "num_parameters")}, indent=2))


if __name__ == "__main__":
    main()
