"""Zoo targets of other families, trained from scratch on the zoo corpus with the zoo tokenizer:
``tinyds`` (DeepSeek-V3 architecture: MLA, sigmoid-routed MoE with one shared expert, two chained MTP
layers in DeepSeek's checkpoint layout), ``tinygemma`` (Gemma 3: sandwich norms, q/k norms, GELU-tanh,
sliding-window layers interleaved with global ones) and ``tinyqwen35`` (Qwen3.5 text: gated DeltaNet and
gated attention 3:1, dense MLP, two MTP layers in Qwen's ``mtp.*`` layout). All are outpace's own model
classes (models/deepseek.py, models/gemma.py, models/qwen3_next.py) trained as they serve, saved as Hugging
Face directories whose config.json names DeepseekV3ForCausalLM / Gemma3ForCausalLM / Qwen3_5ForCausalLM
(transformers' config classes write them).

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
- Gemma's and Qwen3.5's norms scale by (1 + weight), so they start at weight 0 (scale 1);
- Qwen3.5 rather than Qwen3-Next for the hybrid: its MLP is dense by design (Qwen3-Next's is a mixture of
  experts on every layer), and its config names the MTP layers ``mtp_num_hidden_layers`` as released
  Qwen3.5 checkpoints do. Its gated DeltaNet starts as transformers initialises it
  (Qwen3_5PreTrainedModel._init_weights: ``dt_bias`` 1, ``A_log`` = log U(0.01, 16) per value head, so
  the heads' decays range from near 1 to near 0). Its MTP layers are Qwen's (models/drafts/hybrid_mtp.py: shared
  ``fc`` and norms, the target's embedding and head), trained chained as they serve: layer 0 reads the
  target's post-norm state, layer k the normed output of layer k - 1.

Run: ``python -m outpace.train.family_targets tinyds --out zoo/tinyds`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from outpace.checkpoint import save_checkpoint
from outpace.layers.gated_deltanet import GatedDeltaNet
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.router import Router
from outpace.model_config import ModelConfig
from outpace.models.loader import build_model
from outpace.train.chunked_delta_rule import chunked_delta_rule_in_training
from outpace.train.corpus import build_corpus, heldout_prompts
from outpace.train.data import TokenStream
from outpace.train.export import MAX_SHARD_BYTES
from outpace.train.loop import OptimConfig, plot_history, train
from outpace.train.metrics_file import write_metrics
from outpace.train.run_checks import check_field, check_field_types
from outpace.train.target import (
    check_model_fields,
    check_target_out,
    evaluate,
    init_weights,
    mtp_forward_losses,
    sample_completions,
)
from outpace.train.tokenizer import EOS_TOKEN, PAD_TOKEN, save_tokenizer, special_token_ids
from outpace.zoo import TARGET, zoo_dir

DEEPSEEK, GEMMA, QWEN35 = "DeepseekV3ForCausalLM", "Gemma3ForCausalLM", "Qwen3_5ForCausalLM"
ARCHITECTURES = (DEEPSEEK, GEMMA, QWEN35)


@dataclass(frozen=True)
class FamilyRecipe:
    architecture: str
    hidden_size: int
    intermediate_size: int  # DeepSeek: the dense layers' MLP
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
    # Gemma 3 and Qwen3.5's gated attention
    num_kv_heads: int = 1
    head_dim: int = 32
    sliding_window: int = 128
    sliding_window_pattern: int = 3  # every 3rd layer global
    # Qwen3.5's gated DeltaNet (linear attention) and gated attention
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 32
    linear_value_head_dim: int = 32
    full_attention_interval: int = 4  # every 4th layer full attention, the others gated DeltaNet
    partial_rotary_factor: float = 0.25
    # data and optimisation
    vocab_size: int = 4096  # the zoo tokenizer's
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

    def __post_init__(self) -> None:
        """Every field's type against its annotation (``check_field_types``), then its range (the fields shared
        with tinypy's recipe: train/target.py ``check_model_fields``), each refused by name at construction.
        Every family's fields are checked, whichever family the recipe trains, but Qwen3.5's partial rotary
        fraction (the others rotate whole heads)."""
        check_field_types(self)
        check_field(
            self, "architecture", self.architecture in ARCHITECTURES, f"one of {ARCHITECTURES}"
        )
        check_model_fields(self)

        def check(name: str, ok: bool, allowed: str) -> None:
            check_field(self, name, ok, allowed)

        check("q_lora_rank", self.q_lora_rank is None or self.q_lora_rank >= 1, "None or >= 1")
        for name in (
            "kv_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "n_routed_experts",
            "num_experts_per_tok",
            "n_group",
            "topk_group",
            "moe_intermediate_size",
            "head_dim",
            "sliding_window",
            "sliding_window_pattern",
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "full_attention_interval",
        ):
            check(name, getattr(self, name) >= 1, ">= 1")
        for name in ("qk_rope_head_dim", "head_dim"):
            check(name, getattr(self, name) % 2 == 0, "even (rotary embeddings rotate pairs)")
        check(
            "n_routed_experts",
            self.n_routed_experts % self.n_group == 0,
            f"a multiple of n_group ({self.n_group})",
        )
        check("topk_group", self.topk_group <= self.n_group, f"<= n_group ({self.n_group})")
        kept = self.topk_group * (self.n_routed_experts // self.n_group)
        check(
            "num_experts_per_tok",
            self.num_experts_per_tok <= kept,
            f"<= the {kept} experts of the topk_group ({self.topk_group}) groups kept",
        )
        check("n_shared_experts", self.n_shared_experts >= 0, ">= 0")
        check(
            "first_k_dense_replace",
            0 <= self.first_k_dense_replace <= self.num_layers,
            f"in [0, num_layers ({self.num_layers})]",
        )
        check(
            "bias_update_speed",
            math.isfinite(self.bias_update_speed) and self.bias_update_speed >= 0,
            "a finite number >= 0",
        )
        check(
            "linear_num_value_heads",
            self.linear_num_value_heads % self.linear_num_key_heads == 0,
            f"a multiple of linear_num_key_heads ({self.linear_num_key_heads})",
        )
        if self.architecture == QWEN35:  # the only family with partial rotary embeddings
            rotary = int(self.head_dim * self.partial_rotary_factor)
            check(
                "partial_rotary_factor",
                0 < self.partial_rotary_factor <= 1 and rotary >= 2 and rotary % 2 == 0,
                f"in (0, 1], rotating an even number >= 2 of head_dim's ({self.head_dim}) dimensions",
            )

    @property
    def is_deepseek(self) -> bool:
        return self.architecture == DEEPSEEK

    def toy(self, **overrides) -> FamilyRecipe:
        """This family in a CPU-sized shape for tests (seconds)."""
        small = dict(
            hidden_size=32,
            intermediate_size=64,
            num_layers=3,
            num_heads=2,
            moe_intermediate_size=16,
            n_routed_experts=4,
            n_group=2,
            topk_group=1,
            head_dim=16,
            sliding_window=8,
            seq_len=32,
            batch_size=4,
            steps=20,
            warmup_steps=2,
            max_minutes=None,
            max_corpus_bytes=300_000,
            eval_windows=4,
        )
        return dataclasses.replace(self, **{**small, **overrides})


RECIPES = {
    "tinyds": FamilyRecipe(
        DEEPSEEK,
        hidden_size=64,
        intermediate_size=192,
        num_layers=4,
        num_heads=4,
        q_lora_rank=48,
        num_mtp_layers=2,
    ),
    "tinygemma": FamilyRecipe(
        GEMMA,
        hidden_size=128,
        intermediate_size=256,
        num_layers=6,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
    ),
    "tinyqwen35": FamilyRecipe(
        QWEN35,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=4,
        num_kv_heads=1,
        head_dim=32,
        num_mtp_layers=2,
    ),
}


def hf_config(r: FamilyRecipe, eos_id: int, pad_id: int) -> dict:
    """config.json through transformers' own config class of the family."""
    import transformers

    common = dict(
        vocab_size=r.vocab_size,
        hidden_size=r.hidden_size,
        intermediate_size=r.intermediate_size,
        num_hidden_layers=r.num_layers,
        num_attention_heads=r.num_heads,
        max_position_embeddings=r.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    if r.is_deepseek:
        cfg = transformers.DeepseekV3Config(
            **common,
            num_key_value_heads=r.num_heads,
            q_lora_rank=r.q_lora_rank,
            kv_lora_rank=r.kv_lora_rank,
            qk_nope_head_dim=r.qk_nope_head_dim,
            qk_rope_head_dim=r.qk_rope_head_dim,
            v_head_dim=r.v_head_dim,
            n_routed_experts=r.n_routed_experts,
            num_experts_per_tok=r.num_experts_per_tok,
            n_group=r.n_group,
            topk_group=r.topk_group,
            moe_intermediate_size=r.moe_intermediate_size,
            n_shared_experts=r.n_shared_experts,
            first_k_dense_replace=r.first_k_dense_replace,
            norm_topk_prob=True,
            routed_scaling_factor=1.0,
            rms_norm_eps=1e-6,
            num_nextn_predict_layers=r.num_mtp_layers,
        ).to_dict()
        # DeepSeek's own config.json fields (transformers' class omits them; models/deepseek.py DEFAULTS)
        cfg.update(
            num_nextn_predict_layers=r.num_mtp_layers,
            scoring_func="sigmoid",
            topk_method="noaux_tc",
        )
    elif r.architecture == QWEN35:
        types = [
            "full_attention" if (i + 1) % r.full_attention_interval == 0 else "linear_attention"
            for i in range(r.num_layers)
        ]
        cfg = transformers.Qwen3_5TextConfig(
            **common,
            num_key_value_heads=r.num_kv_heads,
            head_dim=r.head_dim,
            layer_types=types,
            linear_num_key_heads=r.linear_num_key_heads,
            linear_num_value_heads=r.linear_num_value_heads,
            linear_key_head_dim=r.linear_key_head_dim,
            linear_value_head_dim=r.linear_value_head_dim,
            rope_parameters=dict(
                rope_type="default",
                rope_theta=10000.0,
                partial_rotary_factor=r.partial_rotary_factor,
            ),
            rms_norm_eps=1e-6,
        ).to_dict()
        # Qwen3.5's own config.json fields (transformers' class omits them; models/drafts/hybrid_mtp.py reads the first)
        cfg.update(mtp_num_hidden_layers=r.num_mtp_layers, mtp_use_dedicated_embeddings=False)
    else:
        types = [
            "full_attention" if (i + 1) % r.sliding_window_pattern == 0 else "sliding_attention"
            for i in range(r.num_layers)
        ]
        cfg = transformers.Gemma3TextConfig(
            **common,
            num_key_value_heads=r.num_kv_heads,
            head_dim=r.head_dim,
            query_pre_attn_scalar=r.head_dim,
            sliding_window=r.sliding_window,
            layer_types=types,
            final_logit_softcapping=None,
            hidden_activation="gelu_pytorch_tanh",
            rms_norm_eps=1e-6,
        ).to_dict()
    cfg.update(architectures=[r.architecture], torch_dtype="bfloat16")
    return cfg


def build_target(r: FamilyRecipe, cfg: ModelConfig, device: str) -> torch.nn.Module:
    """The model, initialised as tinypy's (train/target.py init_weights), the (1 + weight) norms at 0, gated
    DeltaNet's decay parameters as transformers sets them and each DeepSeek MTP layer's embedding and head
    tied to the target's (module docstring)."""
    torch.manual_seed(r.seed)
    model = build_model(
        cfg, torch.float32, device, mtp_own_heads=r.is_deepseek and r.num_mtp_layers > 0
    )
    init_weights(model, r.seed)
    g = torch.Generator().manual_seed(r.seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, Float32RMSNorm) and m.offset == 1.0:
                m.weight.zero_()
            if isinstance(m, GatedDeltaNet):
                m.dt_bias.fill_(1.0)
                m.A_log.copy_(torch.empty(m.num_v_heads).uniform_(0.01, 16, generator=g).log())
    if r.is_deepseek:
        for layer in model.mtp_layers:
            layer.embed_tokens.weight = model.model.embed_tokens.weight
            layer.shared_head.head.weight = model.lm_head.weight
    return model


class ExpertBalancer:
    """DeepSeek-V3's auxiliary-loss-free balancing (module docstring): records each router's choices in a
    forward and, on ``step``, moves every correction bias by ``speed`` towards balance."""

    def __init__(self, model: torch.nn.Module, speed: float) -> None:
        self.speed = speed
        self.routers = [
            m for m in model.modules() if isinstance(m, Router) and m.routing.correction_bias
        ]
        self.loads: dict[Router, torch.Tensor] = {}
        for router in self.routers:
            router.register_forward_hook(self._record)

    def _record(self, router: Router, _inputs, output) -> None:
        if router.training:
            counts = torch.bincount(
                output[1].flatten(), minlength=router.routing.num_experts
            ).float()
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


def checkpoint_tensors(model: torch.nn.Module, copies: bool) -> dict[str, torch.Tensor]:
    """Every tensor under its checkpoint name: parameters in bf16 (with ``copies`` a tied one under each of its
    names, so the MTP layers' embedding and head copies appear as DeepSeek ships them; else once, under its
    first name: Qwen's ``mtp.*``, not the per-step views; the target's tied head once, as its embedding), the
    routers' correction biases in float32 (as DeepSeek-V3's checkpoints keep them)."""
    name = getattr(model, "checkpoint_name", lambda n: n)
    out = {
        name(n): p.detach().to(torch.bfloat16)
        for n, p in model.named_parameters(remove_duplicate=not copies)
        if not n.startswith("lm_head.") or not model.config.tie_word_embeddings
    }
    out.update(
        {
            name(n): b.detach().float()
            for n, b in model.named_buffers()
            if n.endswith("e_score_correction_bias")
        }
    )
    return out


def prepare_data(r: FamilyRecipe, tokenizer_dir: Path, roots=None):
    """The zoo corpus split, tokenized with the zoo tokenizer: (corpus, tokenizer, train, held-out). A recipe
    whose vocabulary is smaller than the tokenizer's is refused before the corpus is read."""
    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    size = tok.get_vocab_size()
    check_field(
        r,
        "vocab_size",
        r.vocab_size >= size,
        f">= the {size} tokens of the tokenizer in {tokenizer_dir}",
    )
    corpus = build_corpus(
        roots, heldout_fraction=r.heldout_fraction, max_total_bytes=r.max_corpus_bytes
    )
    eos = special_token_ids(tok)[EOS_TOKEN]
    return (
        corpus,
        tok,
        TokenStream.from_files(corpus.train, tok, eos),
        TokenStream.from_files(corpus.heldout, tok, eos),
    )


def train_family_target(
    r: FamilyRecipe,
    out_dir: Path,
    device: str = "cpu",
    tokenizer_dir: Path | None = None,
    roots=None,
    num_samples: int = 2,
    command: str = "",
) -> dict:
    """Train, evaluate and save the family target ``r`` as a HF directory in ``out_dir``, which is checked first
    (train/target.py ``check_target_out``: not the tokenizer's directory, whose target it would overwrite)."""
    tokenizer_dir = Path(tokenizer_dir or zoo_dir() / TARGET)
    why = "it holds the tokenizer this run reads, beside a target whose files this run's would overwrite"
    check_target_out(out_dir, roots, (("the tokenizer's directory", tokenizer_dir, why),))
    t0 = time.perf_counter()
    corpus, tok, stream, heldout = prepare_data(r, tokenizer_dir, roots)
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
        extra = {
            "main": losses[0].detach(),
            **{f"mtp depth {k}": losses[k].detach() for k in range(1, len(losses))},
        }
        mtp = torch.stack(losses[1:]).mean() if len(losses) > 1 else 0.0
        return losses[0] + r.mtp_loss_weight * mtp, batch.numel(), extra

    with chunked_delta_rule_in_training():  # gated DeltaNet in chunks (train/chunked_delta_rule.py)
        history = train(
            model,
            loss_fn,
            OptimConfig(
                steps=r.steps, lr=r.lr, warmup_steps=r.warmup_steps, max_minutes=r.max_minutes
            ),
            device,
            desc=r.architecture,
        )
        imbalance = balancer.step()
        windows = heldout.sequential_windows(window, r.eval_windows)
        metrics = evaluate(model, windows, r, device, batch=8)

    out_dir = Path(out_dir)
    save_checkpoint(checkpoint_tensors(model, copies=r.is_deepseek), out_dir, MAX_SHARD_BYTES)
    (out_dir / "config.json").write_text(json.dumps(cfg_dict, indent=2) + "\n")
    save_tokenizer(tok, out_dir, model_max_length=r.max_position_embeddings)
    plot_history(history, out_dir / "loss.png", f"{out_dir.name}: training loss")
    metrics.update(
        recipe=dataclasses.asdict(r),
        corpus=corpus.stats(),
        train_tokens=len(stream),
        heldout_tokens=len(heldout),
        num_parameters=sum(p.numel() for p in model.parameters()),
        train_wall_seconds=history.wall_seconds,
        steps_run=history.total_steps,
        tokens_seen=history.tokens_seen,
        last_expert_load_max_over_mean=imbalance,
        device=torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        history=history.to_dict(),
        samples=sample_completions(
            out_dir, heldout_prompts(corpus, num_samples, prompt_chars=160), device
        ),
        command=command,
    )
    metrics["total_wall_seconds"] = time.perf_counter() - t0
    write_metrics(out_dir, metrics)
    write_family_card(out_dir)
    return metrics


def write_family_card(out_dir: Path) -> None:
    """README.md from training_metrics.json: recipe, command, wall time, data, held-out figures, layout."""
    from outpace.train.model_card import write_model_card

    out_dir = Path(out_dir)
    m = json.loads((out_dir / "training_metrics.json").read_text())
    r, c = m["recipe"], m["corpus"]
    mtp_rows = "".join(
        f"| MTP depth {d} (token t+{int(d) + 1}) | {m['mtp_heldout_loss'][d]:.4f} | "
        f"{m['mtp_heldout_top1'][d]:.4f} |\n"
        for d in sorted(m["mtp_heldout_top1"], key=int)
    )
    data = f"""The zoo corpus (train/corpus.py: Python files of the training machine's stdlib and site-packages, the
first {r["max_corpus_bytes"] / 1e6:.0f} MB; {c["train_files"]:,} train files, {m["train_tokens"]:,} tokens) with the zoo
tokenizer (tinypy's byte-level BPE, {r["vocab_size"]} tokens). Files whose path hash puts them in the
{r["heldout_fraction"]:.0%} held-out side ({c["heldout_files"]:,} files) never train anything. {m["steps_run"]} steps of
{r["batch_size"]} random windows of {r["seq_len"]} tokens: {m["tokens_seen"]:,} tokens seen, on a shared 2-core CPU."""
    heldout = f"""{r["eval_windows"]} held-out windows of {r["seq_len"]} tokens, teacher-forced.

| head | loss (nats/token) | top-1 accuracy |
|---|---|---|
| target (token t+1) | {m["heldout_loss"]:.4f} | {m["heldout_top1"]:.4f} |
{mtp_rows}"""
    if r["architecture"] == DEEPSEEK:
        n = r["num_layers"]
        layout = f"""`DeepseekV3ForCausalLM` as transformers and DeepSeek name its tensors (tied embedding and head).
Layers 0..{r["first_k_dense_replace"] - 1} have a dense MLP, the others an MoE of {r["n_routed_experts"]} routed experts
(top {r["num_experts_per_tok"]}, sigmoid scores, {r["n_group"]} groups of which {r["topk_group"]} are kept, normalised
weights) plus {r["n_shared_experts"]} shared expert, `mlp.experts.{{e}}.{{gate,up,down}}_proj` as DeepSeek's checkpoints
store them; `mlp.gate.e_score_correction_bias` (float32) is the bias the auxiliary-loss-free balancing learned (last
step's busiest expert had {m["last_expert_load_max_over_mean"]:.2f}x the mean load). MLA: q_lora_rank
{r["q_lora_rank"]}, kv_lora_rank {r["kv_lora_rank"]}, qk_nope/rope/v head dims {r["qk_nope_head_dim"]}/{r["qk_rope_head_dim"]}/{r["v_head_dim"]}.
The {r["num_mtp_layers"]} MTP layers are `model.layers.{n}` and `model.layers.{n + 1}` in DeepSeek-V3's layout: `enorm`,
`hnorm`, `eh_proj`, `embed_tokens`, `shared_head.{{norm,head}}` beside an MoE decoder block. They were trained chained
(layer 0 reads the target's post-norm state, layer 1 layer 0's pre-norm output; at row i layer k embeds token i+k+1,
position 0's embedding zeroed, and predicts token i+k+2), with embedding and head tied to the target's as DeepSeek-V3
trains them; the checkpoint holds each copy."""
    elif r["architecture"] == QWEN35:
        rotary = int(r["head_dim"] * r["partial_rotary_factor"])
        layout = f"""`Qwen3_5ForCausalLM` (Qwen3.5's text model, `model_type` qwen3_5_text) as transformers and Qwen name its
tensors (tied embedding and head). {r["num_layers"]} layers, every {r["full_attention_interval"]}th gated full attention
(`layer_types`), the others gated DeltaNet: `linear_attn.{{in_proj_qkv,in_proj_z,in_proj_b,in_proj_a,conv1d,dt_bias,A_log,norm,out_proj}}`,
{r["linear_num_key_heads"]} key heads of {r["linear_key_head_dim"]}, {r["linear_num_value_heads"]} value heads of
{r["linear_value_head_dim"]}, a causal convolution of width 4. Gated attention: {r["num_heads"]} query heads, {r["num_kv_heads"]}
kv head, head_dim {r["head_dim"]}, `q_proj` giving each head's query and output gate, q/k norms, RoPE on the first
{rotary} dimensions (partial_rotary_factor {r["partial_rotary_factor"]}). Dense SwiGLU MLP, (1 + w) RMSNorms.
The {r["num_mtp_layers"]} MTP layers are Qwen's `mtp.*` (`mtp_num_hidden_layers: {r["num_mtp_layers"]}` in config.json):
`fc` over [pre_fc_norm_embedding(embedding), pre_fc_norm_hidden(state)], then `layers.{{k}}` (a gated-attention
layer with a dense MLP), then `norm`; `fc` and the norms are shared by the layers, the embedding and head are the
target's. They were trained with the target, chained as they serve (layer 0 reads the target's post-norm state, layer 1 layer 0's normed output; at row
i layer k embeds token i+k+1 and predicts token i+k+2). Training ran the delta rule in chunks of 64 tokens
(train/chunked_delta_rule.py, the same function as the per-token loop serving runs)."""
    else:
        layout = f"""`Gemma3ForCausalLM` as transformers names its tensors (tied embedding, scaled by sqrt(hidden) on lookup).
{r["num_layers"]} layers, every {r["sliding_window_pattern"]}rd global (`layer_types`), the others sliding over
{r["sliding_window"]} tokens; {r["num_heads"]} query heads, {r["num_kv_heads"]} kv head, head_dim {r["head_dim"]},
query_pre_attn_scalar {r["head_dim"]}, (1 + w) RMSNorms (four per layer, q/k norms), GELU-tanh MLP, no logit softcapping."""
    title = f"{out_dir.name}: a small {r['architecture'].removesuffix('ForCausalLM')}-architecture code model"
    write_model_card(
        out_dir,
        title,
        "A zoo target of outpace for its model family (train/family_targets.py).",
        m.get("command")
        or f"python -m outpace.train.family_targets {out_dir.name} --out zoo/{out_dir.name}",
        {"Data": data, "Held-out results": heldout, "Checkpoint layout": layout},
    )


def parse_budget_args(
    p: argparse.ArgumentParser, argv: list[str] | None
) -> tuple[argparse.Namespace, dict]:
    """Add the training-budget options the family scripts share (--device, --steps, --max-minutes,
    --threads), parse, set the CPU threads, and return (the arguments, the recipe fields they override)."""
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int)
    p.add_argument("--max-minutes", type=float)
    p.add_argument("--threads", type=int, help="torch CPU threads")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    return a, {
        k: v for k, v in (("steps", a.steps), ("max_minutes", a.max_minutes)) if v is not None
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m outpace.train.family_targets", description=__doc__.split("\n")[0]
    )
    p.add_argument("name", choices=sorted(RECIPES))
    p.add_argument("--out", required=True)
    a, overrides = parse_budget_args(p, argv)
    command = "python -m outpace.train.family_targets " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    try:  # a field or --out refused by name, not as a traceback
        recipe = dataclasses.replace(RECIPES[a.name], **overrides)
        metrics = train_family_target(recipe, Path(a.out), a.device, command=command)
    except (ValueError, FileNotFoundError) as e:
        sys.exit(f"error: {e}")
    print(
        json.dumps(
            {
                k: metrics[k]
                for k in (
                    "heldout_loss",
                    "heldout_top1",
                    "mtp_heldout_top1",
                    "train_wall_seconds",
                    "steps_run",
                    "num_parameters",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
