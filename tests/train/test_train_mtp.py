"""The MTP fine-tune recipe: a toy target's chained MTP layers fine-tuned on its greedy continuations; the
loss falls, only the MTP tensors change, the copy serves losslessly with --method mtp and its held-out
acceptance is measured; the chain forward reads the rows and tokens the serving layers read."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.models.loader import load_model
from outpace.train.distill import teacher_forward
from outpace.train.recipes.mtp import MTPRecipe, checkpoint_names, mtp_chain, train_mtp

ZOO = Path(__file__).resolve().parents[2] / "zoo"


@pytest.fixture(scope="module")
def toy_target(mtp_toy_target):
    return mtp_toy_target  # conftest.py's (helpers/mtp_targets.py), built once per session


@pytest.fixture(scope="module")
def toy_run(toy_target, tmp_path_factory, toy_eval_prompts):
    out = tmp_path_factory.mktemp("mtp_tuned")
    recipe = MTPRecipe.toy(eval_prompts=toy_eval_prompts, resume_every=10)
    return toy_target, out, recipe, train_mtp(toy_target, recipe, out, "cpu")


def test_chain_reads_the_serving_rows(toy_target):
    """Layer k at row t equals the served layer run by hand: layer 0 on (token t+1, the target's state at t),
    layer k on (token t+k+1, layer k-1's output at t), all at position t; a shifted token does not match."""
    target = load_model(toy_target, torch.float32, progress=False)
    tokens = torch.randint(3, 300, (2, 10), generator=torch.Generator().manual_seed(0))
    b, t = tokens.shape
    with torch.no_grad():
        hidden = teacher_forward(target, tokens).hidden_states
        logits = mtp_chain(target, target.mtp_layers, hidden, tokens, chained=True)
        positions = torch.arange(t).repeat(b)
        h = hidden
        with forward_context(DenseCausalMetadata(b, t)):
            for k, layer in enumerate(target.mtp_layers):
                ids = torch.cat(
                    [tokens[:, k + 1 :], torch.zeros(b, k + 1, dtype=torch.long)], 1
                ).reshape(-1)
                h = layer(positions, ids, h, target)
                ref = target.compute_logits(h).view(b, t, -1)[:, : t - 1 - k]
                assert torch.allclose(logits[k].view(b, t, -1)[:, : t - 1 - k], ref, atol=1e-5), k
                if k == 1:  # reading token t+k instead of t+k+1 is another function
                    shifted = torch.cat(
                        [tokens[:, k:], torch.zeros(b, k, dtype=torch.long)], 1
                    ).reshape(-1)
                    with torch.no_grad():
                        wrong = target.compute_logits(layer(positions, shifted, h, target))
                    assert (wrong.view(b, t, -1)[:, : t - 1 - k] - ref).abs().max() > 1e-3


def test_loss_falls_and_only_mtp_tensors_change(toy_run):
    target_dir, out, recipe, metrics = toy_run
    losses = metrics["history"]["losses"]
    assert sum(losses[-2:]) / 2 < losses[0] - 1.0, losses
    assert all(metrics["history"]["extra"][f"top1 layer {k}"][-1] > 0.5 for k in range(3))
    assert metrics["num_mtp_layers"] == 3 and metrics["chained"] is True
    assert not (out / "resume").exists()
    before, after = (
        load_file(target_dir / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert before.keys() == after.keys()
    mtp_prefixes = tuple(f"model.layers.{2 + k}." for k in range(3))
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith(mtp_prefixes) for k in changed), sorted(changed)[:5]
    assert all(after[k].dtype == before[k].dtype for k in before)
    assert {
        f"{p}eh_proj.weight" for p in mtp_prefixes
    } <= changed  # every layer moved (bf16 hides tiny steps)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (target_dir / name).read_bytes()
    assert (out / "loss.png").stat().st_size > 1000 and "Held-out acceptance" in (
        out / "README.md"
    ).read_text()


def test_tuned_copy_serves_losslessly_and_heldout_is_measured(toy_run):
    target_dir, out, recipe, metrics = toy_run
    heldout = metrics["heldout"]
    assert heldout["num_prompts"] == 2 and heldout["temperature 0"]["same_output_as_target"] == 1.0
    assert heldout["temperature 0"]["acceptance_length"] >= 1.0 and "temperature 1" in heldout
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 17, 3, 40], [9, 9, 101, 7, 64, 3]]
    expected = [o.token_ids for o in LLM(str(target_dir)).generate(prompts, greedy)]
    spec = SpeculativeConfig("mtp", num_steps=3)
    assert [
        o.token_ids for o in LLM(str(out), speculative=spec).generate(prompts, greedy)
    ] == expected


def test_refusals(toy_target, tmp_path):
    with pytest.raises(ValueError, match="num_layers"):
        train_mtp(toy_target, MTPRecipe.toy(num_layers=4, steps=1), tmp_path / "o", "cpu")
    with pytest.raises(ValueError, match="must differ"):
        train_mtp(toy_target, MTPRecipe.toy(), toy_target, "cpu")


def test_qwen35_layout_is_written_back_under_mtp_names(tmp_path, toy_eval_prompts):
    """Qwen3.5's ``mtp.*`` layout (the steps share ``mtp.fc`` and the norms; each has ``mtp.layers.{k}``): the
    tuned tensors go back under the checkpoint's names, the shared fc once, and nothing of the target moves."""
    target_dir = ZOO / "tinyqwen35"
    out = tmp_path / "tuned"
    train_mtp(target_dir, MTPRecipe.toy(eval_prompts=toy_eval_prompts, steps=4), out, "cpu")
    before, after = (
        load_file(target_dir / "model.safetensors"),
        load_file(out / "model.safetensors"),
    )
    assert before.keys() == after.keys()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("mtp.") for k in changed), sorted(changed)[:5]
    assert {
        "mtp.fc.weight",
        "mtp.layers.0.mlp.down_proj.weight",
        "mtp.layers.1.mlp.down_proj.weight",
    } <= changed


def test_a_layout_that_cannot_be_written_back_is_refused_before_training(toy_target):
    """Names the target's files do not hold are refused by name, with the directory, before any step runs."""
    target = load_model(toy_target, torch.float32, progress=False)
    target.checkpoint_name = lambda name: f"elsewhere.{name}"
    with pytest.raises(
        ValueError, match=r"elsewhere\.mtp_layers\.0\..*not in .*nothing was trained"
    ):
        checkpoint_names(target, target.mtp_layers, Path(toy_target))
