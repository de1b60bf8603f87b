"""EAGLE3 draft training: the training-time-test (TTT) forward equals what the serving draft computes,
aux layer ids survive the config round trip, and a toy run trains, saves and loads."""

import json

import pytest
import torch

from outpace.attention import DenseCausalMetadata, forward_context
from outpace.models.drafts.eagle3 import Eagle3Config, Eagle3Draft, load_eagle3_draft
from outpace.train.recipes.eagle3 import (
    Eagle3Recipe,
    checkpoint_aux_ids,
    default_capture_ids,
    select_draft_vocab,
    ttt_forward,
    vocab_maps,
)

# ---------------------------------------------------------------------------------------------
# TTT forward vs the serving draft (random weights, fp32)

SMALL = dict(
    architectures=["LlamaForCausalLMEagle3"],
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=50,
    draft_vocab_size=20,
    target_hidden_size=24,
    rms_norm_eps=1e-5,
    rope_theta=100.0,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def random_draft():
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Config.from_dict(SMALL), has_embedding=True)
    with torch.no_grad():  # large enough weights that attention is far from uniform
        for name, p in draft.named_parameters():
            p.copy_(
                1.0 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p)
            )
    return draft.eval()


def make_inputs(batch=2, seq=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    aux = torch.randn(batch, seq, 3 * SMALL["target_hidden_size"], generator=g)
    tokens = torch.randint(0, SMALL["vocab_size"], (batch, seq), generator=g)
    return aux, tokens


@torch.no_grad()
def serving_chain(draft, aux_row, tokens_row, t, num_steps, hidden_row_shift=0, position_shift=0):
    """What the serving draft computes for a chain started at row t, through outpace's own attention:
    the draft-extend rows 0..t (hidden fc(aux), token x_{r+1}, position r), then one drafted row per
    step appended to the same causal sequence (hidden: the last output, token x_{t+1+j}, position t+j).
    Returns the output of each step at row t. The shifts build deliberately wrong variants."""
    ids = tokens_row[1 : t + 2]
    positions = torch.arange(t + 1)
    hidden = draft.fuse_aux(aux_row[: t + 1])
    outs = []
    for j in range(num_steps):
        with forward_context(DenseCausalMetadata(1, ids.numel())):
            o = draft(ids, positions, hidden)
        outs.append(o[-1])
        # the drafted row of step j + 1 (wrong variants: another row's output, a wrong position)
        src = o[-1 - hidden_row_shift] if j == 0 else o[-1]
        ids = torch.cat([ids, tokens_row[t + 2 + j : t + 3 + j]])
        positions = torch.cat([positions, torch.tensor([t + 1 + j + position_shift])])
        hidden = torch.cat([hidden, src[None]])
    return outs


def test_ttt_step0_equals_dense_draft_forward(random_draft):
    draft = random_draft
    aux, tokens = make_inputs()
    b, t = tokens.shape
    with torch.no_grad():
        outs = ttt_forward(draft, draft.embed, aux, tokens, num_steps=3)
        next_tokens = torch.cat([tokens[:, 1:], torch.zeros(b, 1, dtype=torch.long)], dim=1)
        with forward_context(DenseCausalMetadata(b, t)):
            ref = draft(
                next_tokens.reshape(-1),
                torch.arange(t).repeat(b),
                draft.fuse_aux(aux).reshape(b * t, -1),
            )
    assert torch.allclose(outs[0].reshape(b * t, -1), ref, atol=1e-5, rtol=0)


def test_ttt_later_steps_equal_serving_chain(random_draft):
    draft = random_draft
    num_steps = 5
    aux, tokens = make_inputs()
    b, seq = tokens.shape
    with torch.no_grad():
        outs = ttt_forward(draft, draft.embed, aux, tokens, num_steps=num_steps)
    checked = 0
    for row in range(b):
        for t in range(0, seq - num_steps - 1):  # rows whose tokens x_{t+1+j} all lie in the window
            ref = serving_chain(draft, aux[row], tokens[row], t, num_steps)
            for j in range(num_steps):
                assert torch.allclose(outs[j][row, t], ref[j], atol=1e-5, rtol=0), (row, t, j)
                checked += 1
            if (
                t >= 1
            ):  # the test can tell: another row's hidden or a shifted position does not match
                wrong_hidden = serving_chain(draft, aux[row], tokens[row], t, 2, hidden_row_shift=1)
                wrong_position = serving_chain(
                    draft, aux[row], tokens[row], t, 2, position_shift=-1
                )
                assert (outs[1][row, t] - wrong_hidden[1]).abs().max() > 1e-3
                assert (outs[1][row, t] - wrong_position[1]).abs().max() > 1e-3
    assert checked >= 20


def test_ttt_gradients_reach_every_draft_weight(random_draft):
    aux, tokens = make_inputs(seed=2)
    outs = ttt_forward(random_draft, random_draft.embed, aux, tokens, num_steps=2)
    sum(random_draft.compute_logits(o).logsumexp(-1).mean() for o in outs).backward()
    for name, p in random_draft.named_parameters():
        if name != "embed_tokens.weight":
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    random_draft.zero_grad(set_to_none=True)


# ---------------------------------------------------------------------------------------------
# Aux layer ids and vocabulary maps


@pytest.mark.parametrize("num_layers", [4, 5, 6, 7, 8, 12, 16, 32, 36, 64])
def test_default_capture_ids_round_trip(num_layers):
    capture = default_capture_ids(num_layers)
    assert len(set(capture)) == 3 and all(0 <= i <= num_layers for i in capture)
    assert list(capture) == sorted(capture)
    written, convention = checkpoint_aux_ids(capture)
    assert convention == "output-of" and written[0] == 1
    cfg = Eagle3Config.from_dict(
        {**SMALL, "eagle_config": {"eagle_aux_hidden_state_layer_ids": written}}
    )
    assert cfg.capture_layer_ids(num_layers) == capture


def test_capture_ids_examples_and_other_conventions():
    assert default_capture_ids(32) == (
        2,
        16,
        29,
    )  # public EAGLE3 Llama-3.1-8B: output-of [1, 15, 28]
    assert checkpoint_aux_ids((2, 16, 29)) == ([1, 15, 28], "output-of")
    assert default_capture_ids(6) == (2, 3, 4)  # [2, 3, 3] would capture one layer twice
    for capture in [(0, 3, 5), (3, 5, 7), (4, 8, 12)]:
        written, convention = checkpoint_aux_ids(capture)
        assert convention == "input-of" and written == list(capture)
        cfg = Eagle3Config.from_dict(
            {**SMALL, "eagle_config": {"eagle_aux_hidden_state_layer_ids": written}}
        )
        assert cfg.capture_layer_ids(16) == capture
    with pytest.raises(ValueError):
        checkpoint_aux_ids((1, 3, 5))
    with pytest.raises(ValueError):
        default_capture_ids(3)


def test_vocab_selection_and_maps():
    freq = torch.tensor([5.0, 0.0, 9.0, 1.0, 9.0, 3.0, 0.0, 7.0])
    ids = select_draft_vocab(freq, 4)
    assert ids.tolist() == [0, 2, 4, 7]
    d2t, t2d = vocab_maps(ids, 8)
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert (torch.arange(4) + d2t).tolist() == ids.tolist()
    assert t2d.nonzero().flatten().tolist() == ids.tolist()


# ---------------------------------------------------------------------------------------------
# A toy run end to end


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory, toy_eval_prompts, trained_toy_target):
    from outpace.train.recipes.eagle3 import train_eagle3

    # six layers like the zoo target: the default capture [2, 3, 3] must become [2, 3, 4]
    target_dir = trained_toy_target(6)[
        0
    ]  # conftest.py: TargetRecipe.toy(steps=30, num_layers=6), trained once
    out = tmp_path_factory.mktemp("eagle3_draft")
    recipe = Eagle3Recipe.toy(eval_prompts=toy_eval_prompts, eval_num_steps=3)
    return target_dir, out, recipe, train_eagle3(target_dir, recipe, out, "cpu")


def test_capture_ids_the_target_lacks_are_refused_before_any_data(toy_run, tmp_path, monkeypatch):
    """aux_layer_ids past the target's last layer's output are refused by name from its config, before a
    continuation is generated and with nothing written."""
    import outpace.train.recipes.eagle3 as recipe_module

    target_dir = toy_run[0]
    monkeypatch.setattr(
        recipe_module, "distillation_inputs", lambda *a, **k: pytest.fail("data was generated")
    )
    refused = r"Eagle3Recipe.aux_layer_ids \[2, 4, 7\]: ids \[7\] are not in the target's 0 .. 6"
    with pytest.raises(ValueError, match=refused):
        recipe_module.train_eagle3(
            target_dir, Eagle3Recipe.toy(aux_layer_ids=(2, 4, 7)), tmp_path / "out", "cpu"
        )
    assert not (tmp_path / "out").exists()


def test_toy_run_loss_falls(toy_run):
    _, _, recipe, metrics = toy_run
    losses = metrics["history"]["losses"]
    assert losses[-1] < losses[0] - 0.3, losses
    extra = metrics["history"]["extra"]
    assert set(extra) == {
        f"{k} step {j}" for k in ("loss", "top1") for j in range(recipe.ttt_steps)
    }
    for j in range(recipe.ttt_steps):
        assert 0.0 <= metrics["final_step_top1"][j] <= 1.0
    assert extra["top1 step 0"][-1] > extra["top1 step 0"][0]
    rates = metrics["history"][
        "tokens_per_second"
    ]  # one per logged step, each over its own log interval
    assert len(rates) == len(losses) and all(r > 0 for r in rates)


def test_steps_compile_on_a_gpu_only():
    recipe = Eagle3Recipe.toy()
    assert recipe.compile_step and recipe.compiles_on("cuda") and recipe.compiles_on("cuda:1")
    assert not recipe.compiles_on("cpu") and not recipe.compiles_on("cuda", num_ranks=2)
    assert not Eagle3Recipe.toy(compile_step=False).compiles_on("cuda")


def test_toy_run_draft_serves_losslessly_and_heldout_is_measured(toy_run):
    from outpace import LLM, SamplingParams
    from outpace.config import SpeculativeConfig

    target_dir, out, recipe, metrics = toy_run
    assert recipe.ttt_steps == 4 and Eagle3Recipe().ttt_steps == 7  # SpecForge's TTT length
    assert Eagle3Recipe().data_temperature == 0.0 and Eagle3Recipe().corpus_fraction == 0.5
    assert not (out / "resume").exists(), "the training state goes once the draft is saved"
    heldout = metrics["heldout"]
    assert heldout["num_prompts"] == 2 and heldout["temperature 0"]["same_output_as_target"] == 1.0
    assert heldout["temperature 0"]["acceptance_length"] >= 1.0 and "temperature 1" in heldout
    assert "| temperature 0 |" in (out / "README.md").read_text()
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 3]]
    expected = [o.token_ids for o in LLM(str(target_dir)).generate(prompts, greedy)]
    for spec in (
        SpeculativeConfig("eagle3", str(out), num_steps=4),
        SpeculativeConfig("eagle3", str(out), num_steps=3, topk=2, num_draft_tokens=6),
    ):
        assert [
            o.token_ids for o in LLM(str(target_dir), speculative=spec).generate(prompts, greedy)
        ] == expected


def test_masked_labels_leave_out_prompt_and_out_of_vocab_rows():
    """Rows whose label is a prompt token, or whose target argmax is outside the draft vocabulary, add
    nothing to a step's loss (SpecForge's loss_mask and position_mask); the others average."""
    from outpace.train.distill import masked_cross_entropy, response_mask

    starts = torch.tensor([3, 0])
    mask = response_mask(starts, 5)
    assert mask.tolist() == [[False, False, True, True, True], [True] * 5]
    g = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    keep = torch.tensor([True, False, True, False])
    loss, _ = masked_cross_entropy(student, teacher, keep)
    kept, _ = masked_cross_entropy(student[keep], teacher[keep])
    assert torch.allclose(loss, kept)
    assert not torch.allclose(loss, masked_cross_entropy(student, teacher)[0])
    hard, top1 = masked_cross_entropy(student, teacher, soft=False)
    ref = torch.nn.functional.cross_entropy(student, teacher.argmax(-1))
    assert torch.allclose(hard, ref) and 0 <= top1 <= 1


def test_toy_run_saves_a_loadable_eagle3_draft(toy_run):
    from safetensors import safe_open

    from outpace.models.loader import load_model

    target_dir, out, recipe, metrics = toy_run
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["tie_word_embeddings"] is False and cfg["torch_dtype"] == "bfloat16"
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    target = load_model(target_dir, torch.float32, progress=False)
    tcfg = target.config
    for key in (
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
    ):
        assert cfg[key] == getattr(tcfg, key), key
    assert (
        cfg["target_hidden_size"] == tcfg.hidden_size
        and cfg["draft_vocab_size"] == recipe.draft_vocab_size
    )

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert f.get_tensor("d2t").dtype == torch.int64 and f.get_tensor("t2d").dtype == torch.bool
    assert {
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "midlayer.hidden_norm.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.mlp.down_proj.weight",
    } <= names
    assert not any("embed_tokens" in n or n.startswith("_target") for n in names)
    assert all(
        n in {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
        or n.startswith("midlayer.")
        for n in names
    )

    draft = load_eagle3_draft(out, target, torch.float32, "cpu")
    # the aux ids round trip: serving captures exactly what training captured
    capture = draft.config.capture_layer_ids(tcfg.num_hidden_layers)
    assert capture == tuple(metrics["capture_layer_ids"]) == default_capture_ids(6) == (2, 3, 4)
    # d2t / t2d agree and pick the most frequent ids of the training mixture
    target_ids = torch.arange(recipe.draft_vocab_size) + draft.d2t
    assert (target_ids.diff() > 0).all() and draft.t2d[target_ids].all()
    assert int(draft.t2d.sum()) == recipe.draft_vocab_size
    assert 0.5 < metrics["draft_vocab_coverage"] <= 1.0
    # the loaded draft runs against the target's captured states
    target.set_aux_hidden_state_layers(capture)
    tokens = torch.randint(0, tcfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, 16)):
        aux = target(tokens[0], torch.arange(16)).aux_hidden_states
        logits = draft.compute_logits(draft(tokens[0], torch.arange(16), draft.fuse_aux(aux)))
    assert logits.shape == (16, recipe.draft_vocab_size) and torch.isfinite(logits).all()
    assert (out / "README.md").read_text().count("Training-time test") == 1
    assert (out / "loss.png").stat().st_size > 1000
