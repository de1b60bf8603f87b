"""The training package at toy scale on the CPU: loss falls, runs reproduce, checkpoints load."""

import json

import pytest
import torch

from outpace.model_config import ModelConfig
from outpace.train.target import TargetRecipe, hf_config, prepare_data, run_target_training

RECIPE = TargetRecipe.toy(steps=30)


@pytest.fixture(scope="module")
def toy_data():
    return prepare_data(RECIPE)


@pytest.fixture(scope="module")
def toy_target(trained_toy_target):
    assert RECIPE == TargetRecipe.toy(steps=30, num_layers=RECIPE.num_layers)
    return trained_toy_target(
        RECIPE.num_layers
    )  # conftest.py: train_target(RECIPE, out, "cpu", num_samples=2)


def test_loss_falls_and_runs_reproduce(toy_data):
    corpus, tok, stream, _ = toy_data
    cfg = ModelConfig.from_dict(hf_config(RECIPE, 0, 1))
    first, _ = run_target_training(RECIPE, cfg, stream, "cpu")
    second, _ = run_target_training(RECIPE, cfg, stream, "cpu")
    assert first.losses == second.losses, (
        "same seed, same data: the curve must repeat exactly on the CPU"
    )
    assert sum(first.losses[-2:]) / 2 < sum(first.losses[:2]) / 2 - 0.5
    assert not set(f.rel_path for f in corpus.train) & set(f.rel_path for f in corpus.heldout)


def test_saved_target_layout(toy_target):
    out, metrics = toy_target
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_nextn_predict_layers"] == 3 and cfg["chain_mtp_hidden_states"] is True
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.norm.weight").dtype == torch.bfloat16
    last = RECIPE.num_layers + RECIPE.num_mtp_layers - 1
    for part in (
        "enorm.weight",
        "hnorm.weight",
        "eh_proj.weight",
        "self_attn.q_proj.weight",
        "mlp.down_proj.weight",
    ):
        assert f"model.layers.{last}.{part}" in names
    assert "lm_head.weight" not in names  # tied
    assert set(metrics["mtp_heldout_top1"]) == {1, 2, 3}
    assert (out / "loss.png").stat().st_size > 1000


def test_transformers_loads_target_and_logits_match(toy_target):
    """transformers' LlamaForCausalLM (ignoring the MTP weights) agrees with outpace's forward."""
    from transformers import AutoModelForCausalLM

    from outpace.attention import DenseCausalMetadata, forward_context
    from outpace.models.loader import load_model

    out, _ = toy_target
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ours = load_model(out, torch.float32)
    ids = torch.randint(0, RECIPE.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, 24)):
        ref = hf(ids).logits[0]
        logits = ours.compute_logits(ours(ids[0], torch.arange(24)).hidden_states)
    assert ((logits - ref).norm() / ref.norm()).item() < 1e-4
