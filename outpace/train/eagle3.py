"""``outpace train draft --method eagle3``: an EAGLE3 draft (one decoder layer over fused target
aux hidden states) trained with training-time test (TTT) against the target's soft labels.

Shapes follow the target: the draft's hidden size, heads and head_dim are the target's, so it
borrows the target's embedding (the checkpoint has no ``embed_tokens``). Its head covers a draft
vocabulary of the ``draft_vocab_size`` most frequent target ids in the training data.

Training-time test, for token windows x [B, T] (row t of the draft holds target position t):
- step 0: row t reads g_t = fuse_aux(aux_t) and the embedding of x_{t+1} at position t, attends
  causally over rows 0..t, and its pre-norm output o^0_t predicts x_{t+2};
- step j >= 1: row t reads o^{j-1}_t (the previous step's output at the same row) and x_{t+1+j}
  at position t + j, and predicts x_{t+2+j}. It attends to the step-0 keys/values of rows 0..t
  and to its own step-i keys/values for i = 1..j: exactly what the serving draft sees j steps
  into a chain (the draft-extend rows, then the rows it drafted itself).
Labels are the target's distribution at row t+1+j restricted to the draft vocabulary; rows whose
label index t+1+j >= T are left out. Loss = sum_j 0.8^j loss_j / sum_j 0.8^j.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from outpace.config import ModelConfig
from outpace.models.eagle3 import Eagle3Config, Eagle3Draft, Eagle3Layer
from outpace.models.loader import default_dtype, load_model
from outpace.train.distill import DistillData, DistillRecipe, soft_cross_entropy, teacher_forward
from outpace.train.export import common_metrics, save_trained
from outpace.train.loop import train
from outpace.train.target import init_weights

STEP_DECAY = 0.8  # weight of TTT step j: STEP_DECAY ** j


@dataclass(frozen=True)
class Eagle3Recipe(DistillRecipe):
    draft_vocab_size: int = 2048
    intermediate_size: int | None = None        # None: the target's
    aux_layer_ids: tuple[int, ...] | None = None  # capture ids (input-of); None: default_capture_ids(L)
    ttt_steps: int = 6
    init_head_from_target: bool = True          # lm_head rows and final norm start as the target's

    def __post_init__(self) -> None:
        if self.ttt_steps < 1:
            raise ValueError(f"Eagle3Recipe.ttt_steps={self.ttt_steps} is invalid: must be >= 1")
        if self.batch_size < 2:
            raise ValueError(f"Eagle3Recipe.batch_size={self.batch_size} is invalid: must be >= 2 "
                             "(half continuations, half corpus windows)")
        if self.draft_vocab_size < 1:
            raise ValueError(f"Eagle3Recipe.draft_vocab_size={self.draft_vocab_size} is invalid: must be >= 1")
        if self.prompt_len + self.new_tokens <= self.ttt_steps + 1:
            raise ValueError("Eagle3Recipe: windows of prompt_len + new_tokens tokens must be longer than "
                             f"ttt_steps + 1 = {self.ttt_steps + 1}")

    @classmethod
    def toy(cls, **overrides) -> Eagle3Recipe:
        """A CPU-sized recipe for tests: trains in seconds."""
        return cls(**{**dict(draft_vocab_size=128, num_continuations=8, prompt_len=8, new_tokens=24, batch_size=4,
                             steps=30, lr=1e-2, warmup_steps=2, max_minutes=None, max_corpus_bytes=300_000),
                      **overrides})


# ---------------------------------------------------------------------------------------------
# Aux layer ids and the draft's vocabulary


def default_capture_ids(num_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs the draft reads: [2, L // 2, L - 3] (the EAGLE3 default).

    NOTE: for shallow targets the default repeats a layer (L = 6 gives [2, 3, 3]), which would feed
    ``fc`` the same state twice; later ids are moved up to the next free layer instead (L = 6:
    [2, 3, 4]), so the three aux states are always distinct. Deep targets get the default as is.
    """
    ids: list[int] = []
    for i in (2, num_layers // 2, num_layers - 3):
        ids.append(max(i, ids[-1] + 1) if ids else i)
    if ids[-1] > num_layers or ids[0] < 0:
        raise ValueError(f"a target with {num_layers} layers is too shallow for three distinct aux layers "
                         f"starting at the input of layer 2")
    return tuple(ids)


def checkpoint_aux_ids(capture: tuple[int, ...]) -> tuple[list[int], str]:
    """The ``eagle_aux_hidden_state_layer_ids`` to write for capture (input-of) ids, and their convention.

    Readers (``Eagle3Config.capture_layer_ids``, SGLang, vLLM) take a first id of 1 as "output of
    layer X" and anything else as "input of layer X". So: when the first capture id is 2, write the
    output-of ids (capture - 1, first id 1, as public EAGLE3 checkpoints do); otherwise write the
    capture ids as they are. A first capture id of 1 fits neither convention and is refused.
    """
    if capture[0] == 1:
        raise ValueError("capturing the input of layer 1 first cannot be written unambiguously in "
                         "eagle_aux_hidden_state_layer_ids (a first id of 1 means 'output of layer 1')")
    if capture[0] == 2:
        return [i - 1 for i in capture], "output-of"
    return list(capture), "input-of"


def token_frequencies(continuations: torch.Tensor, stream_tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[vocab] float64: the token frequency of the training mixture (half continuations, half corpus)."""
    cont = torch.bincount(continuations.reshape(-1).long(), minlength=vocab_size).double()
    corpus = torch.bincount(stream_tokens.reshape(-1).long(), minlength=vocab_size).double()
    return 0.5 * cont / cont.sum().clamp(min=1) + 0.5 * corpus / corpus.sum().clamp(min=1)


def select_draft_vocab(freq: torch.Tensor, size: int) -> torch.Tensor:
    """[size] int64: the ``size`` most frequent target ids (ties: lower id first), sorted by id."""
    order = torch.sort(freq, descending=True, stable=True).indices
    return torch.sort(order[:size]).values.long()


def vocab_maps(draft_ids: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [draft_vocab] int64 with target id = i + d2t[i], t2d [vocab] bool marking the draft ids)."""
    d2t = draft_ids.long() - torch.arange(draft_ids.numel(), dtype=torch.int64)
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[draft_ids.long()] = True
    return d2t, t2d


def eagle3_config(target_cfg: ModelConfig, recipe: Eagle3Recipe, capture: tuple[int, ...],
                  draft_vocab_size: int) -> dict:
    """config.json in the public EAGLE3 format (``LlamaForCausalLMEagle3``)."""
    ids, _ = checkpoint_aux_ids(capture)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": recipe.intermediate_size or target_cfg.intermediate_size,
        "num_attention_heads": target_cfg.num_attention_heads,
        "num_key_value_heads": target_cfg.num_key_value_heads,
        "head_dim": target_cfg.head_dim,
        "num_hidden_layers": 1,
        "vocab_size": target_cfg.vocab_size,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": target_cfg.hidden_size,
        "hidden_act": "silu",
        "rms_norm_eps": target_cfg.rms_norm_eps,
        "rope_theta": target_cfg.rope_theta,
        "max_position_embeddings": target_cfg.max_position_embeddings,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
    }
    if target_cfg.rope_scaling is not None:
        cfg["rope_scaling"] = target_cfg.rope_scaling
    if target_cfg.eos_token_ids:
        cfg["eos_token_id"] = list(target_cfg.eos_token_ids)
    return cfg


# ---------------------------------------------------------------------------------------------
# Training-time test


def _shift_tokens(tokens: torch.Tensor, shift: int) -> torch.Tensor:
    """[B, T] -> [B, T] with row t holding x_{t+shift} (token 0 past the window: those rows never
    reach the loss)."""
    return F.pad(tokens[:, shift:], (0, min(shift, tokens.shape[1])), value=0)


def _project(layer: Eagle3Layer, positions: torch.Tensor, embeds: torch.Tensor, hidden: torch.Tensor):
    """embeds, hidden [B, T, H]; positions [T] -> q [B, heads, T, d], k, v [B, kv_heads, T, d]."""
    attn = layer.self_attn
    b, t, _ = hidden.shape
    d = attn.cfg.head_dim
    x = torch.cat((layer.input_layernorm(embeds), layer.hidden_norm(hidden)), dim=-1)
    q = attn.q_proj(x).view(b * t, -1, d)
    k = attn.k_proj(x).view(b * t, -1, d)
    v = attn.v_proj(x).view(b, t, -1, d)
    if attn.cfg.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = attn.rotary(positions.repeat(b), q, k)
    return q.view(b, t, -1, d).transpose(1, 2), k.view(b, t, -1, d).transpose(1, 2), v.transpose(1, 2)


def ttt_attention(q: torch.Tensor, kv: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """Attention of TTT step j = len(kv) - 1.

    q [B, heads, T, d]; kv[i] = (k, v) [B, kv_heads, T, d] of step i. Row t attends to the step-0
    keys of rows 0..t (causal) and to the step-i key of row t itself for i = 1..j (one diagonal per
    later step), under one softmax. Returns [B, T, heads * d].
    """
    b, heads, t, d = q.shape
    kv_heads = kv[0][0].shape[1]
    qg = q.view(b, kv_heads, heads // kv_heads, t, d)  # GQA: query head h reads kv head h // group
    k0, v0 = kv[0][0].unsqueeze(2), kv[0][1].unsqueeze(2)  # [B, kv_heads, 1, T, d]
    causal = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    scores = [(qg @ k0.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))]  # [B, kvh, g, T, T]
    scores += [(qg * k.unsqueeze(2)).sum(-1, keepdim=True) * scale for k, _ in kv[1:]]  # [B, kvh, g, T, 1]
    probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
    out = probs[..., :t] @ v0
    for i, (_, v) in enumerate(kv[1:]):
        out = out + probs[..., t + i: t + i + 1] * v.unsqueeze(2)
    return out.reshape(b, heads, t, d).transpose(1, 2).reshape(b, t, heads * d)


def ttt_forward(draft: Eagle3Draft, embed: Callable[[torch.Tensor], torch.Tensor], aux: torch.Tensor,
                tokens: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """aux [B, T, num_aux * target_hidden], tokens [B, T] -> [o^0, ..., o^{num_steps-1}], each
    [B, T, hidden] pre-norm: o^j at row t is the draft's output j steps into a chain started at t.

    ``embed`` maps token ids to embeddings (the target's; in training it carries no gradient).
    """
    layer = draft.midlayer
    b, t = tokens.shape
    if t + num_steps - 1 > draft.config.layer.max_position_embeddings:
        raise ValueError(f"TTT positions reach {t + num_steps - 2}, beyond the draft's "
                         f"max_position_embeddings {draft.config.layer.max_position_embeddings}")
    scale = layer.self_attn.attn.scale
    hidden = draft.fuse_aux(aux)  # [B, T, hidden]
    base = torch.arange(t, device=tokens.device)
    kv: list[tuple[torch.Tensor, torch.Tensor]] = []
    outputs = []
    for j in range(num_steps):
        embeds = embed(_shift_tokens(tokens, 1 + j))  # row t: x_{t+1+j}
        q, k, v = _project(layer, base + j, embeds, hidden)  # row t sits at position t + j
        kv.append((k, v))
        h = hidden + layer.self_attn.o_proj(ttt_attention(q, kv, scale))
        hidden = h + layer.mlp(layer.post_attention_layernorm(h))
        outputs.append(hidden)
    return outputs


def ttt_losses(draft: Eagle3Draft, outputs: list[torch.Tensor], teacher_logits: torch.Tensor):
    """outputs from ``ttt_forward``; teacher_logits [B, T, draft_vocab] (the target's logits on the
    draft vocabulary) -> (losses, top-1 agreements), one per step. Step j at row t is scored
    against the target's distribution at row t + 1 + j; rows with t + 1 + j >= T are left out."""
    t = teacher_logits.shape[1]
    losses, top1 = [], []
    for j, o in enumerate(outputs):
        rows = t - 1 - j
        student = draft.compute_logits(o[:, :rows]).flatten(0, 1)  # [B * rows, draft_vocab]
        teacher = teacher_logits[:, 1 + j:].flatten(0, 1)
        losses.append(soft_cross_entropy(student, teacher))
        top1.append((student.argmax(-1) == teacher.argmax(-1)).float().mean().detach())
    return losses, top1


def weighted_loss(losses: list[torch.Tensor]) -> torch.Tensor:
    weights = [STEP_DECAY ** j for j in range(len(losses))]
    return sum(w * l for w, l in zip(weights, losses)) / sum(weights)


# ---------------------------------------------------------------------------------------------
# The recipe


def draft_state_dict(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """Checkpoint tensors: parameters in bf16, d2t (int64) and t2d (bool) as they are."""
    state = {name: p.detach().to(torch.bfloat16) for name, p in draft.named_parameters()}
    state.update(d2t=draft.d2t.detach(), t2d=draft.t2d.detach())
    return state


def train_eagle3(target_dir: Path, recipe: Eagle3Recipe, out_dir: Path, device: str) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    target_dir, out_dir = Path(target_dir), Path(out_dir)
    data = DistillData.for_recipe(target_dir, recipe, device)
    target = load_model(target_dir, torch.bfloat16 if device.startswith("cuda") else torch.float32, device,
                        progress=False)
    target.requires_grad_(False)
    tcfg: ModelConfig = target.config
    capture = tuple(recipe.aux_layer_ids) if recipe.aux_layer_ids else default_capture_ids(tcfg.num_hidden_layers)
    target.set_aux_hidden_state_layers(capture)

    freq = token_frequencies(data.continuations, data.stream.tokens, tcfg.vocab_size)
    vocab_ids = select_draft_vocab(freq, min(recipe.draft_vocab_size, tcfg.vocab_size))
    d2t, t2d = vocab_maps(vocab_ids, tcfg.vocab_size)
    cfg_dict = eagle3_config(tcfg, recipe, capture, vocab_ids.numel())
    cfg = Eagle3Config.from_dict(cfg_dict)
    # NOTE: what serving captures must be what we train with.
    assert cfg.capture_layer_ids(tcfg.num_hidden_layers) == capture, (cfg.aux_layer_ids, capture)

    with default_dtype(torch.float32), torch.device(device):
        draft = Eagle3Draft(cfg, has_embedding=False, has_head=True)
    init_weights(draft, recipe.seed)
    with torch.no_grad():
        draft.d2t.copy_(d2t)
        draft.t2d.copy_(t2d)
        if recipe.init_head_from_target:
            draft.lm_head.weight.copy_(target.lm_head.weight[vocab_ids.to(device)].float())
            draft.norm.weight.copy_(target.model.norm.weight.float())
    vocab_dev = vocab_ids.to(device)
    gen = torch.Generator().manual_seed(recipe.seed)

    def loss_fn(step: int):
        tokens = data.batch(recipe.batch_size, gen).to(device)
        b, t = tokens.shape
        out = teacher_forward(target, tokens)
        with torch.no_grad():
            aux = out.aux_hidden_states.view(b, t, -1)
            teacher = target.compute_logits(out.hidden_states)[:, vocab_dev].view(b, t, -1)
        outputs = ttt_forward(draft, target.embed, aux, tokens, recipe.ttt_steps)
        losses, top1 = ttt_losses(draft, outputs, teacher)
        extra = {**{f"loss step {j}": l.detach() for j, l in enumerate(losses)},
                 **{f"top1 step {j}": a for j, a in enumerate(top1)}}
        return weighted_loss(losses), tokens.numel(), extra

    history = train(draft, loss_fn, recipe.optim, device, desc="eagle3 draft")

    written, convention = checkpoint_aux_ids(capture)
    metrics = dict(
        common_metrics(recipe, draft, history, t0, device),
        final_step_loss={j: history.extra[f"loss step {j}"][-1] for j in range(recipe.ttt_steps)},
        final_step_top1={j: history.extra[f"top1 step {j}"][-1] for j in range(recipe.ttt_steps)},
        target_num_layers=tcfg.num_hidden_layers, capture_layer_ids=list(capture),
        checkpoint_aux_layer_ids=written, checkpoint_aux_convention=convention,
        draft_vocab_size=vocab_ids.numel(), draft_vocab_coverage=float(freq[vocab_ids].sum()))
    return save_trained(out_dir, draft_state_dict(draft), cfg_dict, history,
                        "EAGLE3 draft: TTT loss (soft CE vs target, per step)", metrics, write_eagle3_card,
                        plotted_prefix="loss")


TRAIN_COMMAND = ("python -m outpace train draft --method eagle3 --target zoo/tinypy --out zoo/tinypy-eagle3 "
                 "--device cuda --steps 6000 --max-minutes 4.0")


def write_eagle3_card(out_dir: Path, m: dict) -> None:
    from outpace.train.model_card import write_model_card

    r = m["recipe"]
    steps = sorted(m["final_step_top1"], key=int)
    rows = "\n".join(f"| {j} | x(t+{int(j) + 2}) | {m['final_step_loss'][j]:.4f} | {m['final_step_top1'][j]:.4f} |"
                     for j in steps)
    sections = {
        "Data": f"""{r['num_continuations']} continuations of {r['new_tokens']} tokens that the target sampled at
temperature 0.8 after {r['prompt_len']}-token prompts cut from the corpus's train split, mixed half and half with
raw train-split windows of the same length ({r['prompt_len'] + r['new_tokens']} tokens), {r['batch_size']}
windows per batch. Held-out files are never used. The draft vocabulary is the {m['draft_vocab_size']} most frequent
target ids in that mixture (they cover {100 * m['draft_vocab_coverage']:.1f}% of its tokens), sorted by id.""",
        "Training-time test": f"""The target runs once per batch (no gradient) and gives the aux hidden states
(the inputs of its layers {m['capture_layer_ids']}, concatenated) and its logits. The draft then runs
{r['ttt_steps']} simulated draft steps over every row t of the window at once. Step 0 reads `fc(aux_t)` and the
embedding of token t+1 at position t, attends causally, and predicts token t+2. Step j reads the step j-1 output
of the same row and token t+1+j at position t+j, and predicts token t+2+j; its attention sees the step-0
keys/values of rows 0..t plus its own row's keys/values of steps 1..j, which is exactly what the serving draft
sees j steps into a chain. Each step's loss is the cross-entropy against the target's distribution at that
position restricted to the draft vocabulary (soft labels); rows whose label falls outside the window are left out.
Total loss = sum_j 0.8^j loss_j / sum_j 0.8^j. The head starts from the target's head rows of the draft
vocabulary {'(and its final norm)' if r['init_head_from_target'] else '(not used: random init)'}. Final training
loss: {m['final_loss']:.4f}.

Last logged training batch, per step (top-1: agreement with the target's argmax over the draft vocabulary):

| step | predicts | loss | top-1 |
|---|---|---|---|
{rows}""",
        "Checkpoint layout": f"""`LlamaForCausalLMEagle3` in the public EAGLE3 format: `fc.weight`
(3 x target hidden -> hidden), `midlayer.*` (`input_layernorm`, `hidden_norm`, `self_attn.{{q,k,v}}_proj` over
[embedding, hidden], `self_attn.o_proj`, `post_attention_layernorm`, `mlp.*`), `norm.weight`, `lm_head.weight`
(draft vocabulary), `d2t` (target id = draft id + d2t[draft id]) and `t2d` (bool over the target vocabulary). No
`embed_tokens`: the draft borrows the target's. `eagle_config.eagle_aux_hidden_state_layer_ids` =
{m['checkpoint_aux_layer_ids']} in the "{m['checkpoint_aux_convention']}" convention (a first id of 1 means
"output of layer X"), i.e. the inputs of target layers {m['capture_layer_ids']}.""",
        "Acceptance": """Acceptance lengths are measured by outpace's engine on held-out prompts
(`--method eagle3`), not by this training run; they are added here once measured.""",
    }
    write_model_card(out_dir, "tinypy-eagle3: an EAGLE3 draft for tinypy",
                     "One decoder layer over three of the target's hidden states, for `--method eagle3`.",
                     TRAIN_COMMAND, sections)
