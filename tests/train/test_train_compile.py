"""On a GPU the draft recipes compile their training step (``compile_step``, train/ranks.py ``DraftStep``):
the compiled EAGLE3, DFlash and MTP steps give the eager step's loss and gradients under bf16 autocast, on the
call that compiles them and on later calls after the weights moved in place, as an optimizer moves them.
(EAGLE3 and DFlash passed on an H100, MTP on an H200; all three compile by default.)

The later calls matter: Inductor (torch 2.11, H100) once compiled the hand-written TTT attention so that
gradients were right on the compiling call only (train/recipes/eagle3.py ``ttt_attention``)."""

import pytest
import torch

from outpace.models.drafts.dflash import DFlashConfig, DFlashDraft
from outpace.models.drafts.eagle3 import Eagle3Config, Eagle3Draft
from outpace.models.loader import load_model
from outpace.train.distill import decayed_weights, teacher_forward, weighted_loss
from outpace.train.recipes import dflash as D
from outpace.train.recipes import eagle3 as E
from outpace.train.recipes import mtp as M

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="training steps are compiled on a GPU only"
)

HIDDEN, VOCAB, BATCH, SEQ = 128, 512, 8, 96
SHAPE = dict(
    hidden_size=HIDDEN,
    intermediate_size=256,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=16,
    vocab_size=VOCAB,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    max_position_embeddings=256,
)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-12)).item()


def assert_compiled_matches_eager(model: torch.nn.Module, step, rounds: int = 3) -> None:
    """step(model) -> scalar loss. Each round compares eager and compiled loss and gradients, then moves
    every weight in place."""
    params = [p for p in model.parameters() if p.requires_grad]
    compiled = torch.compile(step, dynamic=False)
    g = torch.Generator(device="cuda").manual_seed(0)
    for round_ in range(rounds):
        results = []
        for fn in (step, compiled):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = fn(model)
            results.append((loss.detach(), torch.autograd.grad(loss, params)))
        (loss_e, grads_e), (loss_c, grads_c) = results
        assert relative_error(loss_c, loss_e) < 1e-2, (round_, loss_c.item(), loss_e.item())
        worst = max(relative_error(c, e) for c, e in zip(grads_c, grads_e))
        assert worst < 5e-2, f"round {round_}: compiled gradients off by {worst:.2e} relative"
        with torch.no_grad():
            for p in params:
                p.add_(0.02 * torch.randn(p.shape, generator=g, device="cuda"))


def test_compiled_eagle3_step_matches_eager():
    torch.manual_seed(0)
    cfg = Eagle3Config.from_dict(
        dict(
            architectures=["LlamaForCausalLMEagle3"],
            draft_vocab_size=256,
            target_hidden_size=HIDDEN,
            **SHAPE,
        )
    )
    with torch.device("cuda"):
        draft = Eagle3Draft(cfg, has_embedding=False, has_head=True)
        embed = torch.nn.Embedding(VOCAB, HIDDEN).to(torch.bfloat16).requires_grad_(False)
        aux = torch.randn(BATCH, SEQ, 3 * HIDDEN, dtype=torch.bfloat16)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
        teacher = 3 * torch.randn(BATCH, SEQ, 256)
        mask = torch.rand(BATCH, SEQ) < 0.8
    ttt_steps = 7

    def step(d):
        losses, _ = E.ttt_losses(d, E.ttt_forward(d, embed, aux, tokens, ttt_steps), teacher, mask)
        return weighted_loss(losses, decayed_weights(len(losses), E.STEP_DECAY))

    assert_compiled_matches_eager(draft, step)


def test_compiled_dflash_step_matches_eager():
    torch.manual_seed(0)
    block, anchors_per_row = 8, 24
    cfg = DFlashConfig.from_dict(
        dict(
            architectures=["DFlashDraftModel"],
            model_type="qwen3",
            num_hidden_layers=2,
            num_target_layers=4,
            block_size=block,
            tie_word_embeddings=False,
            dflash_config=dict(block_size=block, mask_token_id=2, target_layer_ids=[0, 1, 3]),
            **SHAPE,
        )
    )
    with torch.device("cuda"):
        draft = DFlashDraft(cfg, HIDDEN)
        embed = torch.nn.Embedding(VOCAB, HIDDEN).to(torch.bfloat16).requires_grad_(False)
        head = torch.nn.Linear(HIDDEN, VOCAB, bias=False).to(torch.bfloat16).requires_grad_(False)
        aux = torch.randn(BATCH, SEQ, 3 * HIDDEN, dtype=torch.bfloat16)
        tokens = torch.randint(0, VOCAB, (BATCH, SEQ))
    draft.borrow(embed, head)
    anchors = D.sample_anchors(
        BATCH, SEQ, block, anchors_per_row, torch.Generator().manual_seed(0), 8
    ).to("cuda")
    teacher = 3 * torch.randn(BATCH, anchors_per_row, block - 1, VOCAB, device="cuda")

    def step(d):
        losses, _ = D.block_losses(d, D.dflash_forward(d, embed, aux, tokens, anchors), teacher)
        return weighted_loss(losses, D.position_weights(len(losses) + 1, 4.0))

    assert_compiled_matches_eager(draft, step)


def test_compiled_mtp_step_matches_eager(mtp_toy_target):
    """The target's own MTP layers, chained, as train/recipes/mtp.py trains them: fp32 layers over a bf16 target."""
    torch.manual_seed(0)
    target = load_model(mtp_toy_target, torch.bfloat16, "cuda", progress=False)
    layers = M.trainable_mtp(target.mtp_layers, 3)
    tokens = torch.randint(3, 300, (BATCH, SEQ), device="cuda")
    with torch.no_grad():
        hidden = teacher_forward(target, tokens).hidden_states  # [BATCH * SEQ, hidden]
        teacher = target.compute_logits(hidden).view(BATCH, SEQ, -1)  # [BATCH, SEQ, vocab]
    mask = torch.rand(BATCH, SEQ, device="cuda") < 0.8

    def step(mtp):
        losses, _ = M.depth_losses(
            M.mtp_chain(target, mtp, hidden, tokens, chained=True), teacher, mask, soft=True
        )
        return weighted_loss(losses, decayed_weights(len(losses), 1.0))

    assert_compiled_matches_eager(layers, step)
