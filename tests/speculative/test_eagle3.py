"""EAGLE3 drafts: checkpoint format, aux-layer conventions, fit checks, and lossless generation."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.spec_models import make_eagle3_draft
from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.models.drafts.eagle3 import DraftMismatchError, load_eagle3_draft
from outpace.models.loader import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


@pytest.fixture(scope="module")
def target6(tmp_path_factory):
    """A 6-layer random Llama: deep enough that the aux conventions differ."""
    return save_hf_model(
        make_hf_model("llama", num_hidden_layers=6), tmp_path_factory.mktemp("target6")
    )


@pytest.mark.parametrize(
    "ids,expected",
    [
        ([1, 2, 4], (2, 3, 5)),  # first id 1: "output of layer X" -> input of X + 1
        ([2, 3, 5], (2, 3, 5)),  # first id 2: already "input of layer X"
        (None, (2, 3, 3)),  # absent: [2, L // 2, L - 3]
        ([0, 3, 6], (0, 3, 6)),  # capturing the last layer's output (index L) works
    ],
)
def test_aux_id_conventions_capture_the_intended_layers(target6, tmp_path, ids, expected):
    from transformers import AutoModelForCausalLM

    draft_dir = make_eagle3_draft(target6, tmp_path / "d", aux_ids=ids)
    target = load_model(target6, torch.float32)
    draft = load_eagle3_draft(draft_dir, target, torch.float32, "cpu")
    capture = draft.config.capture_layer_ids(6)
    assert capture == expected
    target.set_aux_hidden_state_layers(capture)
    x = torch.randint(0, 200, (11,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, 11)):
        out = target(x, torch.arange(11))
        hf_states = (
            AutoModelForCausalLM.from_pretrained(target6)
            .eval()(x[None], output_hidden_states=True)
            .hidden_states
        )
    parts = out.aux_hidden_states.chunk(3, dim=-1)
    for layer, part in zip(capture, parts):
        # transformers' hidden_states[i] is the input of layer i (its last entry is post-norm)
        reference = out.hidden_states if layer == 6 else hf_states[layer][0]
        torch.testing.assert_close(part, reference, rtol=1e-5, atol=1e-5)
        if 0 < layer < 6:  # the other convention's offset would capture a different tensor
            assert not torch.allclose(part, hf_states[layer - 1][0], atol=1e-3)


def _edit_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_drafts_that_do_not_fit_are_refused(target6, tmp_path):
    good = make_eagle3_draft(target6, tmp_path / "good", draft_vocab_size=120)
    target = load_model(target6, torch.float32)
    load_eagle3_draft(good, target, torch.float32, "cpu")
    cases = {
        "target_hidden_size 64": _edit_config(good, tmp_path / "h", target_hidden_size=64),
        "vocab_size 999": _edit_config(good, tmp_path / "v", vocab_size=999),
        "layers \\[9": _edit_config(
            good, tmp_path / "a", eagle_config={"eagle_aux_hidden_state_layer_ids": [2, 4, 9]}
        ),
    }
    for message, path in cases.items():
        with pytest.raises(DraftMismatchError, match=message):
            load_eagle3_draft(path, target, torch.float32, "cpu")
    bad_map = shutil.copytree(good, tmp_path / "d2t")
    tensors = load_file(bad_map / "model.safetensors")
    tensors["d2t"][5] = 10_000
    save_file(tensors, bad_map / "model.safetensors")
    with pytest.raises(DraftMismatchError, match="d2t"):
        load_eagle3_draft(bad_map, target, torch.float32, "cpu")
    with pytest.raises(DraftMismatchError, match="hidden"):
        LLM(
            str(target6),
            speculative=SpeculativeConfig("eagle3", str(cases["target_hidden_size 64"])),
        )


@pytest.mark.parametrize("topk,num_draft_tokens", [(1, None), (3, 10)])
def test_random_eagle3_is_lossless(target6, tmp_path, topk, num_draft_tokens):
    draft = make_eagle3_draft(target6, tmp_path / "d", draft_vocab_size=150, use_aux_norm=True)
    prompts = [[(i * 29 + j * 3) % 200 for j in range(4 + 6 * i)] for i in range(5)]
    expected = [o.token_ids for o in LLM(str(target6), block_size=4).generate(prompts, GREEDY)]
    spec = SpeculativeConfig(
        "eagle3", str(draft), num_steps=4, topk=topk, num_draft_tokens=num_draft_tokens
    )
    llm = LLM(
        str(target6), block_size=4, num_kv_blocks=40, max_num_batched_tokens=24, speculative=spec
    )
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.pool.num_free == 40
