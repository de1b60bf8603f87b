"""The DFlash recipe: its block attention equals the draft's explicit-mask forward (which the serving
path equals, tests/test_dflash.py), anchors fall in the continuations, labels on greedy continuations are
the tokens serving verifies, and a toy run trains, resumes, saves a draft that serves losslessly and
measures its held-out acceptance."""

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.spec_models import dflash_config_dict
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from outpace.models.drafts.dflash import DFlashConfig, DFlashDraft, load_dflash_draft
from outpace.models.loader import load_model
from outpace.train.distill import DistillData, teacher_forward
from outpace.train.recipes.dflash import (
    DFlashRecipe,
    block_inputs,
    dflash_config,
    dflash_forward,
    sample_anchors,
    teacher_rows,
    train_dflash,
)


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    target = save_hf_model(
        make_hf_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("t4")
    )
    torch.manual_seed(0)
    draft = DFlashDraft(DFlashConfig.from_dict(dflash_config_dict(target, block_size=5)), 48)
    with torch.no_grad():  # weights large enough that attention is far from uniform
        for p in draft.parameters():
            p.copy_(
                1.0 + 0.2 * torch.randn_like(p)
                if p.dim() == 1
                else 1.5 * torch.randn_like(p) / p.shape[1] ** 0.5
            )
    embedding = torch.nn.Embedding(256, 48)
    return draft.eval(), embedding


def test_block_attention_equals_explicit_mask_forward(random_draft):
    """Many overlapping blocks per window, GQA (4 heads over 2): the factored attention is forward_dense."""
    draft, embedding = random_draft
    g = torch.Generator().manual_seed(1)
    b, t, n = 2, 30, draft.config.block_size
    tokens = torch.randint(0, 200, (b, t), generator=g)
    aux = torch.randn(b, t, draft.config.num_features * 48, generator=g)
    anchors = sample_anchors(b, t, n, 12, g, first=torch.tensor([3, 9]))
    with torch.no_grad():
        ours = dflash_forward(draft, embedding, aux, tokens, anchors)  # [b, K, B, hidden]
        ids, positions, mask = block_inputs(tokens, anchors, n, draft.config.mask_token_id)
        context = draft.fuse(aux)
        ref = draft.forward_dense(
            context, torch.arange(t).expand(b, t), embedding(ids), positions, mask
        )
        assert (ours.reshape(ref.shape) - ref).abs().max() < 1e-4
        # the comparison can fail: blocks that also see their anchor's own context row differ
        mask[:, :, :t] = torch.arange(t)[None, None] <= anchors.repeat_interleave(n, 1)[:, :, None]
        wrong = draft.forward_dense(
            context, torch.arange(t).expand(b, t), embedding(ids), positions, mask
        )
        assert (ours.reshape(wrong.shape) - wrong).abs().max() > 1e-3


def test_anchors_are_distinct_and_inside_each_rows_range():
    g = torch.Generator().manual_seed(0)
    first = torch.tensor([7, 7, 1])
    a = sample_anchors(3, 24, 4, 10, g, first=first)
    assert (a >= first[:, None]).all() and a.max() <= 21 and (a.diff(dim=1) > 0).all()
    full = sample_anchors(2, 24, 4, 21 - 7 + 1, g, first=7)  # every candidate taken
    assert full.tolist() == [list(range(7, 22))] * 2
    with pytest.raises(ValueError, match="fewer than"):
        sample_anchors(1, 24, 4, 16, g, first=7)


def test_labels_on_greedy_continuations_are_the_continuation(peaked_target):  # noqa: F811
    """On the target's greedy continuation (``data_temperature`` 0, the ablation's "greedy data"), the argmax
    label of block row i (the target's logits at row a + i - 1) is the token at a + i, for every anchor in the
    continuation: what greedy verification accepts."""
    r = DFlashRecipe.toy(data_temperature=0.0, corpus_fraction=0.0)  # continuations only
    data = DistillData.for_recipe(peaked_target, r, "cpu", r.generation_batch)
    tokens = data.batch(4, torch.Generator().manual_seed(0))
    target = load_model(peaked_target, torch.float32, progress=False)
    b, t = tokens.shape
    anchors = sample_anchors(
        b, t, r.block_size, r.num_anchors, torch.Generator().manual_seed(1), first=r.prompt_len - 1
    )
    logits = target.compute_logits(teacher_forward(target, tokens).hidden_states).view(b, t, -1)
    rows = teacher_rows(anchors, r.block_size)  # [b, K, B - 1]
    labels = logits.argmax(-1).gather(1, rows.flatten(1)).view(rows.shape)
    inside = rows + 1 < t  # the last anchor's last label is the target's token after the window
    nexts = tokens.gather(1, (rows + 1).clamp(max=t - 1).flatten(1)).view(rows.shape)
    assert inside.float().mean() > 0.9 and torch.equal(labels[inside], nexts[inside])
    prompt_labels = logits[:, : r.prompt_len - 2].argmax(-1)  # human text: not greedy
    assert not torch.equal(prompt_labels, tokens[:, 1 : r.prompt_len - 1])


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("max_checkpoint_mib", 0.01, "over DFlashRecipe.max_checkpoint_mib=0.01"),
        ("target_layer_ids", (1, 9), "layers \\[9\\] are not in the target's"),
        (
            "num_key_value_heads",
            4,
            "num_key_value_heads=4 is invalid: must be a divisor of num_attention_heads=6",
        ),
    ],
)
def test_a_draft_shape_the_target_cannot_take_is_refused_before_any_data(
    peaked_target, tmp_path, monkeypatch, field, value, error
):  # noqa: F811
    """A draft over its size budget or reading layers the target lacks is refused by name from the target's
    config, before a continuation is generated (DistillData never built) and with nothing written."""
    import outpace.train.recipes.dflash as recipe_module

    monkeypatch.setattr(
        recipe_module, "distillation_inputs", lambda *a, **k: pytest.fail("data was generated")
    )
    with pytest.raises(ValueError, match=error):
        train_dflash(peaked_target, DFlashRecipe.toy(**{field: value}), tmp_path / "out", "cpu")
    assert not (tmp_path / "out").exists()
    assert DFlashRecipe().max_checkpoint_mib is None  # a user's target has no zoo budget by default


def test_a_draft_may_have_fewer_kv_heads_than_its_target(peaked_target):  # noqa: F811
    """``num_key_value_heads`` narrows the draft's k/v projections (depth within a size budget); None keeps the
    target's."""
    tcfg = load_model(peaked_target, torch.float32, progress=False).config
    for kv_heads, expected in ((None, tcfg.num_key_value_heads), (3, 3)):
        cfg_dict = dflash_config(tcfg, DFlashRecipe.toy(num_key_value_heads=kv_heads), (0,), 2)
        draft = DFlashDraft(DFlashConfig.from_dict(cfg_dict), tcfg.hidden_size)
        assert cfg_dict["num_key_value_heads"] == expected
        assert draft.layers[0].self_attn.k_proj.weight.shape[0] == expected * tcfg.head_dim


@pytest.fixture(scope="module")
def toy_run(peaked_target, tmp_path_factory, toy_eval_prompts):  # noqa: F811
    out = tmp_path_factory.mktemp("dflash_toy")
    recipe = DFlashRecipe.toy(eval_prompts=toy_eval_prompts, resume_every=10)
    return peaked_target, out, recipe, train_dflash(peaked_target, recipe, out, "cpu")


def test_toy_run_loss_falls_and_the_draft_serves_losslessly(toy_run):
    target_dir, out, recipe, metrics = toy_run
    losses = metrics["history"]["losses"]
    assert sum(losses[-2:]) / 2 < losses[0] - 0.5, losses
    assert not (out / "resume").exists(), "the training state goes once the draft is saved"
    heldout = metrics["heldout"]
    assert heldout["num_prompts"] == 2 and heldout["temperature 0"]["same_output_as_target"] == 1.0
    assert heldout["temperature 0"]["acceptance_length"] >= 1.0 and "temperature 1" in heldout
    card = (out / "README.md").read_text()
    assert (
        "Held-out acceptance" in card
        and "| temperature 0 |" in card
        and "at temperature 0.4" in card
    )

    target = load_model(target_dir, torch.float32, progress=False)
    load_dflash_draft(out, target, torch.float32, "cpu")
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 2 + 1]]
    expected = [o.token_ids for o in LLM(str(target_dir)).generate(prompts, greedy)]
    spec = SpeculativeConfig("dflash", str(out), num_steps=recipe.block_size - 1)
    assert [
        o.token_ids for o in LLM(str(target_dir), speculative=spec).generate(prompts, greedy)
    ] == expected


def test_a_stopped_run_resumes_to_the_same_draft(toy_run, tmp_path, monkeypatch):
    """Stop the same recipe after 25 of its 30 steps (state saved at 10 and 20), start it again: it goes
    on from step 20 with the saved data, and the draft equals the uninterrupted run's."""
    from safetensors.torch import load_file

    import outpace.train.recipes.dflash as recipe_module

    target_dir, out, recipe, _ = toy_run
    recipe = DFlashRecipe.toy(resume_every=10, eval_prompts=None)
    original = recipe_module.block_losses
    calls = {"n": 0}

    def stopping(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 26:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(recipe_module, "block_losses", stopping)
    with pytest.raises(KeyboardInterrupt):
        train_dflash(target_dir, recipe, tmp_path, "cpu")
    assert (tmp_path / "resume" / "state.pt").is_file() and (
        tmp_path / "resume" / "data.pt"
    ).is_file()

    def no_generation(*args, **kwargs):
        raise AssertionError("a resumed run reads its continuations from the saved data")

    monkeypatch.setattr("outpace.train.distill.target_continuations", no_generation)
    calls["n"] = -(10**9)  # no second stop
    metrics = train_dflash(target_dir, recipe, tmp_path, "cpu")
    assert (
        metrics["history"]["steps"][0] == 0 and len(metrics["history"]["steps"]) == 4
    )  # steps 0, 10, 20, 29
    # the recipe's clock started again when the run resumed at step 20: the card says so rather than "in all"
    assert metrics["history"]["resumed_from_step"] == 20
    assert "resumed at step 20: its last process took" in (tmp_path / "README.md").read_text()
    assert "s in all, data preparation and evaluation included" in (out / "README.md").read_text()
    resumed, uninterrupted = (
        load_file(tmp_path / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
