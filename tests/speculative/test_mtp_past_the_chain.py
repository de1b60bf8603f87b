"""Drafting more steps than a target has MTP layers (speculative/drafters/mtp.py): the chain's last layer goes
on autoregressively. Step j > S is layer S - 1 at row L + j - S - 1, reading draft j - 1 and its own output at
the row before; the served drafts equal that chain computed by hand over the whole sequence, densely."""

from pathlib import Path

import pytest
import torch

from helpers.spec_models import random_llama
from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.models.loader import load_model
from outpace.train.distill import teacher_forward

ZOO = Path(__file__).resolve().parents[2] / "zoo"
STEPS = 5


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp_past_chain")
    return {
        "random-3-layers": random_llama(root / "mtp3", 300, seed=0, mtp_layers=3, chained=True),
        "tinyds": ZOO / "tinyds",  # two DeepSeek-V3 layers: MLA, routed experts
    }


def _first_drafts(path: Path, prompt: list[int], device: str) -> tuple[list[int], list[int]]:
    """(the greedy output, the drafts of the first decode step) of an engine drafting ``STEPS`` steps."""
    spec = SpeculativeConfig("mtp", num_steps=STEPS, adaptive=False)
    llm = LLM(str(path), device=device, dtype="float32", speculative=spec)
    proposer, drafted = llm.engine.proposer, []
    draft = proposer.draft
    proposer.draft = lambda rows, shape: drafted.append(draft(rows, shape)) or drafted[-1]
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    return out[0].token_ids, drafted[0].token_ids[0, 1:].tolist()


def _chain_by_hand(target, committed: torch.Tensor, drafts: list[int]) -> list[int]:
    """The drafts after ``committed`` [L + 1] (positions 0 .. L): each layer over rows 0 .. L - 1 (layer k's row t
    reads token t + k + 1, drafts past L), then the last layer over one more row a step, its input at row r >= L
    its own output at row r - 1; each draft the argmax at the last row."""
    layers, length = list(target.mtp_layers), committed.numel() - 1
    tokens = torch.cat(
        [committed, torch.tensor(drafts)]
    )  # drafts only fill token slots a layer reads
    hidden = teacher_forward(target, committed[None, :length]).hidden_states  # [L, hidden]
    found, h = [], None
    with forward_context(DenseCausalMetadata(1, length)):
        for k, layer in enumerate(layers):
            state = layer.target_state(target, hidden) if h is None else h
            inputs = state  # layer k's input rows
            h = layer(
                torch.arange(length, device=tokens.device),
                tokens[k + 1 : k + 1 + length],
                state,
                target,
            )
            found.append(int(layer.compute_logits(target, h[-1:]).argmax()))
    reach = len(layers)  # the last layer's row t reads token t + reach
    for rows in range(length + 1, length + 1 + STEPS - len(layers)):
        inputs = torch.cat([inputs, h[-1:]])  # row rows - 1 reads the output at the row before
        with forward_context(DenseCausalMetadata(1, rows)):
            h = layers[-1](
                torch.arange(rows, device=tokens.device),
                tokens[reach : reach + rows],
                inputs,
                target,
            )
        found.append(int(layers[-1].compute_logits(target, h[-1:]).argmax()))
    return found


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", ["random-3-layers", "tinyds"])
def test_steps_past_the_chain_are_its_last_layer_going_on(targets, name, device):
    path = targets[name]
    prompt = [(i * 37 + 11) % 250 + 3 for i in range(9)]
    plain = LLM(str(path), device=device, dtype="float32").generate(
        [prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    )
    output, drafts = _first_drafts(path, prompt, device)
    assert output == plain[0].token_ids and len(drafts) == STEPS  # lossless
    target = load_model(path, torch.float32, device, progress=False)
    # the first decode step drafts after the first token
    committed = torch.tensor(prompt + output[:1], device=device)
    with torch.no_grad():
        assert drafts == _chain_by_hand(target, committed, drafts)
