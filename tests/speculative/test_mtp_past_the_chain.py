"""Drafting more steps than a target has MTP layers (speculative/drafters/mtp.py): the chain's last layer goes
on autoregressively. Step j > S is layer S - 1 at row L + j - S - 1, reading draft j - 1 and its own output at
the row before. Sampled at temperature 1, each draft's distribution q equals that chain's softmax computed by
hand over the whole sequence, densely (argmaxes alone let a wrong layer or row pass on random weights); greedy,
the output is plain decoding's."""

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
PROMPT = [(i * 37 + 11) % 250 + 3 for i in range(9)]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp_past_chain")
    return {
        "random-3-layers": random_llama(root / "mtp3", 300, seed=0, mtp_layers=3, chained=True),
        "tinyds": ZOO / "tinyds",  # two DeepSeek-V3 layers: MLA, routed experts
    }


def _engine(path: Path, device: str, cuda_graphs: bool = True) -> LLM:
    spec = SpeculativeConfig("mtp", num_steps=STEPS, adaptive=False)
    return LLM(str(path), device=device, dtype="float32", speculative=spec, cuda_graphs=cuda_graphs)


def _first_drafts(llm: LLM, params: SamplingParams):
    """(the output, the first decode step's ``Drafts``) of ``PROMPT``. The engine must run its steps eagerly (no
    CUDA graphs): a captured step calls ``draft`` only while it is captured."""
    proposer, drafted = llm.engine.proposer, []
    draft = proposer.draft
    proposer.draft = lambda rows, shape: drafted.append(draft(rows, shape)) or drafted[-1]
    out = llm.generate([PROMPT], params)[0]
    return out.token_ids, drafted[0]


def _chain_by_hand(target, committed: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """[STEPS, vocab] the logits of each draft after ``committed`` [L + 1] (positions 0 .. L; ``drafts`` [STEPS]
    fill the token slots past L that a layer reads): each layer over rows 0 .. L - 1 (layer k's row t reads token
    t + k + 1), then the last layer over one more row a step, its input at row r >= L its own output at row r - 1;
    each draft's logits those of the last row."""
    layers, length = list(target.mtp_layers), committed.numel() - 1
    tokens = torch.cat([committed, drafts])
    hidden = teacher_forward(target, committed[None, :length]).hidden_states  # [L, hidden]
    found, h = [], None
    with forward_context(DenseCausalMetadata(1, length)):
        for k, layer in enumerate(layers):
            inputs = layer.target_state(target, hidden) if h is None else h  # layer k's input rows
            rows = torch.arange(length, device=tokens.device)
            h = layer(rows, tokens[k + 1 : k + 1 + length], inputs, target)
            found.append(layer.compute_logits(target, h[-1:]))
    reach = len(layers)  # the last layer's row t reads token t + reach
    for n in range(length + 1, length + 1 + STEPS - len(layers)):  # rows 0 .. n - 1
        inputs = torch.cat([inputs, h[-1:]])  # row n - 1 reads the output at the row before
        with forward_context(DenseCausalMetadata(1, n)):
            rows = torch.arange(n, device=tokens.device)
            h = layers[-1](rows, tokens[reach : reach + n], inputs, target)
        found.append(layers[-1].compute_logits(target, h[-1:]))
    return torch.cat(found)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("name", ["random-3-layers", "tinyds"])
def test_steps_past_the_chain_are_its_last_layer_going_on(targets, name, device):
    path = targets[name]
    llm = _engine(path, device, cuda_graphs=False)  # the same kernels, ``draft`` called each step
    output, drafts = _first_drafts(llm, SamplingParams(temperature=1.0, max_tokens=2))
    q = drafts.draft_probs[0]  # [STEPS, vocab]: unseeded at temperature 1, softmax of the logits
    assert q.shape[0] == STEPS
    target = load_model(path, torch.float32, device, progress=False)
    # the first decode step drafts after the prompt's sampled token
    committed = torch.tensor(PROMPT + output[:1], device=device)
    with torch.no_grad():
        want = _chain_by_hand(target, committed, drafts.token_ids[0, 1:]).softmax(-1)
    torch.testing.assert_close(q, want, atol=1e-5, rtol=1e-4)
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = LLM(str(path), device=device, dtype="float32").generate([PROMPT], greedy)
    assert _engine(path, device).generate([PROMPT], greedy)[0].token_ids == plain[0].token_ids
