"""EAGLE3 drafts on DeepSeek-V3 (MLA + MoE) and Gemma 3 / Gemma 4 targets (fp32, CPU, random weights).

- the aux states captured are those of the intended layers (transformers' hidden states as reference),
  in each family's id convention: the first-id rule on DeepSeek, "output of layer X" always on Gemma
  (models/drafts/eagle3_aux_ids.py), the last layer's output included; the wrong offset captures other tensors
  and changes the draft's proposals;
- the embedding a draft reads: ``embed_scale`` (SpecForge's rule) folded into the norm after it equals
  the scaled lookup, and the wrong scale changes the proposals; SpecForge's aux-norm names load;
- lossless speculation, chain and tree: greedy equality (a draft narrower than the DeepSeek target,
  with its own embedding and aux norms), and the sampling chi-square test on DeepSeek.
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.deepseek_models import make_hf_deepseek, paged_logits
from helpers.gemma_models import PROMPT, make_gemma
from helpers.hf_models import checkpoint_cache, save_hf_model
from helpers.spec_models import make_eagle3_draft
from helpers.stats import chi_square_p_value, joint_of_three
from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.layers.norm import RMSNorm
from outpace.layers.sampler import SamplingTensors, logits_to_probs
from outpace.models.drafts.eagle3 import Eagle3Config, load_eagle3_draft, target_capture_ids
from outpace.models.drafts.eagle3_aux_ids import FIRST_ID_RULE, GEMMA_OUTPUT_IDS
from outpace.models.loader import load_model

DS_LAYERS, DS_VOCAB = 6, 13
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SHAPES = {"chain": dict(num_steps=3), "tree": dict(num_steps=3, topk=2, num_draft_tokens=6)}


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    """A 6-layer DeepSeek-V3 (MLA with q_lora_rank, YaRN, grouped sigmoid MoE, a dense first layer) with a
    13-token vocabulary (random drafts are accepted now and then) -> (transformers model, directory)."""
    hf = make_hf_deepseek("v3-yarn", num_hidden_layers=DS_LAYERS, vocab_size=DS_VOCAB)
    return hf, save_hf_model(hf, tmp_path_factory.mktemp("deepseek"))


@pytest.fixture(scope="module")
def narrow_draft(deepseek, tmp_path_factory):
    """hidden 40 against the target's 48: its own embedding; aux norms; output-of ids; 10 draft tokens.
    Seed 1: random weights whose drafts the target accepts now and then (seed 0's chain never is)."""
    return make_eagle3_draft(
        deepseek[1],
        tmp_path_factory.mktemp("narrow"),
        draft_vocab_size=10,
        aux_ids=[1, 2, 4],
        seed=1,
        has_embedding=True,
        hidden_size=40,
        intermediate_size=56,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=10,
        use_aux_norm=True,
    )


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """variant -> (transformers model, directory): the 5-layer Gemma 3 and Gemma 4 (per-layer embeddings,
    sliding windows of 7) of helpers/gemma_models.py."""
    return checkpoint_cache(tmp_path_factory, make_gemma)


def target_forward(target, ids: torch.Tensor, capture):
    """One prefill of ids [n] over the paged cache (MLA runs there only), capturing ``capture``."""
    bind_kv_cache(target.model, BlockPool(8, 16), torch.float32, "cpu")
    target.set_aux_hidden_state_layers(tuple(capture))
    with (
        torch.no_grad(),
        forward_context(build_paged_metadata([[5, 2, 7]], [0], [ids.numel()], 16, "cpu")),
    ):
        return target(ids, torch.arange(ids.numel()))


def captured_aux(target, ids: torch.Tensor, capture) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """-> (last layer's pre-norm output [n, hidden], the captured states, each [n, hidden])."""
    out = target_forward(target, ids, capture)
    return out.hidden_states, list(out.aux_hidden_states.chunk(len(capture), dim=-1))


def assert_captures_are_the_layer_inputs(target, hf, ids, capture, last_norm):
    """Each captured state is transformers' input of that layer (index L: the last output, which
    transformers reports after the final norm ``last_norm``); the neighbouring layer's is different."""
    with torch.no_grad():
        reference = hf(ids[None], output_hidden_states=True).hidden_states
    last, parts = captured_aux(target, ids, capture)
    num_layers = target.config.num_hidden_layers
    for layer, part in zip(capture, parts):
        if layer == num_layers:
            torch.testing.assert_close(part, last)
            torch.testing.assert_close(last_norm(part), reference[layer][0], rtol=1e-4, atol=1e-4)
        else:
            torch.testing.assert_close(part, reference[layer][0], rtol=1e-4, atol=1e-4)
        assert not torch.allclose(part, reference[layer - 1][0], atol=1e-3), (
            f"layer {layer} = layer {layer - 1}?"
        )


# ---- DeepSeek ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "written,expected",
    [
        ([1, 2, 4], (2, 3, 5)),  # first id 1: "output of layer X"
        ([2, 3, 6], (2, 3, 6)),  # first id 2: "input of layer X" (6 = L: the last layer's output)
        (None, (2, 3, 3)),  # absent: [2, L // 2, L - 3]
    ],
)
def test_deepseek_captures_follow_the_first_id_rule(deepseek, tmp_path, written, expected):
    hf, path = deepseek
    target = load_model(path, torch.float32)
    draft = load_eagle3_draft(
        make_eagle3_draft(path, tmp_path / "d", aux_ids=written), target, torch.float32, "cpu"
    )
    capture = target_capture_ids(draft.config, target)
    assert capture == expected
    ids = torch.randint(0, DS_VOCAB, (17,), generator=torch.Generator().manual_seed(2))
    assert_captures_are_the_layer_inputs(target, hf, ids, capture, target.model.norm)


def test_deepseek_wrong_offset_captures_other_tensors(deepseek):
    """Kimi-K2.5's draft writes input-of ids starting at 2; adding 1 to them (the bug of the seed review)
    captures different MLA/MoE states."""
    target = load_model(deepseek[1], torch.float32)
    cfg = Eagle3Config.from_dict(
        {
            "hidden_size": 48,
            "vocab_size": DS_VOCAB,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "eagle_aux_hidden_state_layer_ids": [2, 3, 5],
        }
    )
    right = target_capture_ids(cfg, target)
    wrong = tuple(i + 1 for i in cfg.aux_layer_ids)
    assert right == (2, 3, 5)
    ids = torch.randint(0, DS_VOCAB, (15,), generator=torch.Generator().manual_seed(3))
    for a, b in zip(captured_aux(target, ids, right)[1], captured_aux(target, ids, wrong)[1]):
        assert not torch.allclose(a, b, atol=1e-3)


@pytest.fixture(scope="module")
def deepseek_plain(deepseek):
    prompts = [[1, 5, 2, 7, 3], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2], list(range(13)) * 2]
    return prompts, [
        o.token_ids for o in LLM(str(deepseek[1]), block_size=4).generate(prompts, GREEDY)
    ]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_deepseek_greedy_is_lossless(shape, deepseek, narrow_draft, deepseek_plain):
    prompts, expected = deepseek_plain
    llm = LLM(
        str(deepseek[1]),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=16,
        speculative=SpeculativeConfig("eagle3", str(narrow_draft), **SHAPES[shape]),
    )
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0, "no draft was ever accepted"
    assert llm.engine.pool.num_free == 64


@pytest.fixture(scope="module")
def deepseek_joint(deepseek):
    """The target's exact joint distribution of the first three sampled tokens (top-k 3: 27 cells)."""
    prompt, params = (
        [1, 5, 2, 7, 3],
        SamplingParams(temperature=0.8, top_k=3, max_tokens=3, ignore_eos=True),
    )
    model = load_model(deepseek[1], torch.float32)
    st = SamplingTensors.from_params([params], "cpu")
    bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")

    def next_probs(seq):
        with torch.no_grad():
            return logits_to_probs(paged_logits(model, torch.tensor(seq))[-1:], st)[0].double()

    return prompt, params, joint_of_three(next_probs, prompt, DS_VOCAB)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_deepseek_sampling_follows_the_target_distribution(
    shape, deepseek, narrow_draft, deepseek_joint
):
    prompt, params, joint = deepseek_joint
    trials = 3000
    llm = LLM(
        str(deepseek[1]),
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        seed=11,
        speculative=SpeculativeConfig("eagle3", str(narrow_draft), **SHAPES[shape]),
    )
    outs = llm.generate([prompt] * trials, params)
    emitted = torch.tensor([o.token_ids for o in outs])  # [trials, 3]
    index = (emitted[:, 0] * DS_VOCAB + emitted[:, 1]) * DS_VOCAB + emitted[:, 2]
    assert chi_square_p_value(torch.bincount(index, minlength=DS_VOCAB**3), trials * joint) > 1e-3
    assert (
        sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.05 * trials
    )  # speculation really ran


# ---- Gemma ------------------------------------------------------------------------------------------------------

GEMMAS = ["gemma3", "gemma4"]


@pytest.mark.parametrize("variant", GEMMAS)
@pytest.mark.parametrize(
    "written,expected",
    [
        ([1, 2, 4], (2, 3, 5)),  # 5 = L: the last layer's output
        (
            [2, 3, 4],
            (3, 4, 5),
        ),  # output-of even when the first id is 2 (the first-id rule would keep them)
        (None, (2, 2, 3)),  # absent: [2, L // 2, L - 2]
    ],
)
def test_gemma_captures_are_output_of_ids(variant, written, expected, gemma, tmp_path):
    hf, path = gemma(variant)
    target = load_model(path, torch.float32)
    draft = load_eagle3_draft(
        make_eagle3_draft(path, tmp_path / "d", aux_ids=written), target, torch.float32, "cpu"
    )
    capture = target_capture_ids(draft.config, target)
    assert capture == expected
    if len(set(capture)) == len(capture):
        ids = torch.tensor(PROMPT)
        assert_captures_are_the_layer_inputs(target, hf, ids, capture, target.model.norm)


def draft_proposals(draft, target, ids: torch.Tensor, capture) -> torch.Tensor:
    """The draft's first proposal after every prefix of ``ids`` [n] (its greedy token, as a target id) [n - 1]."""
    n = ids.numel()
    aux = target_forward(target, ids, capture).aux_hidden_states
    with torch.no_grad():
        with forward_context(DenseCausalMetadata(1, n - 1)):
            hidden = draft(ids[1:], torch.arange(n - 1), draft.fuse_aux(aux[:-1]))
        return draft.draft_to_target(draft.compute_logits(hidden).argmax(-1))


@pytest.mark.parametrize("variant", GEMMAS)
def test_gemma_wrong_offset_or_embedding_scale_changes_proposals(variant, gemma, tmp_path):
    """The draft reads sqrt(hidden) * the raw rows (``target_model_type`` gemma: SpecForge's rule), which
    equals the scaled lookup under its norm's eps; reading them unscaled, or capturing by the first-id
    rule, proposes other tokens. The draft's eps is raised to 1e-2: the scale reaches the output only
    through the eps of the norm the embedding passes first (1e-6 would hide it behind rounding)."""
    _, path = gemma(variant)
    target = load_model(path, torch.float32)
    common = dict(aux_ids=[2, 3, 4], rms_norm_eps=1e-2)
    scaled = load_eagle3_draft(
        make_eagle3_draft(path, tmp_path / "s", target_model_type="gemma3_text", **common),
        target,
        torch.float32,
        "cpu",
    )
    raw = load_eagle3_draft(
        make_eagle3_draft(path, tmp_path / "r", **common), target, torch.float32, "cpu"
    )
    hidden = target.config.hidden_size
    assert (scaled.config.embed_scale, raw.config.embed_scale) == (hidden**0.5, 1.0)
    ids = torch.tensor(PROMPT * 2)
    # the folded scale is the scaled lookup (target.embed: Gemma's own, times sqrt(hidden)) under eps 1e-2
    layer_norm = scaled.midlayer.input_layernorm
    reference = RMSNorm(hidden, 1e-2)
    reference.weight.data.copy_(layer_norm.weight)
    with torch.no_grad():
        torch.testing.assert_close(
            layer_norm(scaled.embed(ids)), reference(target.embed(ids)), rtol=1e-5, atol=1e-5
        )
    capture = target_capture_ids(scaled.config, target)
    assert capture == (3, 4, 5)
    proposals = draft_proposals(scaled, target, ids, capture)
    assert (proposals != draft_proposals(raw, target, ids, capture)).any(), (
        "the embedding scale changed nothing"
    )
    first_id_rule = scaled.config.capture_layer_ids(target.config.num_hidden_layers, FIRST_ID_RULE)
    assert first_id_rule == (2, 3, 4)
    assert (proposals != draft_proposals(scaled, target, ids, first_id_rule)).any(), (
        "the id offset changed nothing"
    )


def test_specforge_aux_norm_names_load(gemma, tmp_path):
    """SpecForge's Gemma drafts name the aux norms aux_norm_{low,mid,high}: they load as fc_norm.{0,1,2}."""
    _, path = gemma("gemma3")
    target = load_model(path, torch.float32)
    ours = make_eagle3_draft(path, tmp_path / "ours", aux_ids=[1, 2, 4], use_aux_norm=True)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    tensors = load_file(ours / "model.safetensors")
    for i, name in enumerate(("low", "mid", "high")):
        tensors[f"aux_norm_{name}.weight"] = tensors.pop(f"fc_norm.{i}.weight")
    save_file(tensors, theirs / "model.safetensors")
    (theirs / "config.json").write_text((ours / "config.json").read_text())
    a, b = (load_eagle3_draft(d, target, torch.float32, "cpu") for d in (ours, theirs))
    for i in range(3):
        torch.testing.assert_close(a.fc_norm[i].weight, b.fc_norm[i].weight)
    assert not torch.equal(a.fc_norm[0].weight, a.fc_norm[1].weight)


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("variant", GEMMAS)
def test_gemma_greedy_is_lossless(variant, shape, gemma, tmp_path):
    """Last-layer capture, aux norms, the scaled embedding; the 14-token prompt in chunks of 10 and every
    verify past the 7-row window."""
    _, path = gemma(variant)
    draft = make_eagle3_draft(
        path,
        tmp_path / "d",
        draft_vocab_size=150,
        aux_ids=[1, 2, 4],
        use_aux_norm=True,
        target_model_type="gemma3_text",
    )
    prompts = [PROMPT, PROMPT[3:] + PROMPT[:5]]
    params = GREEDY.replace(max_tokens=32)
    expected = [o.token_ids for o in LLM(str(path), block_size=4).generate(prompts, params)]
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=10,
        speculative=SpeculativeConfig("eagle3", str(draft), **SHAPES[shape]),
    )
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.spec_metrics.num_draft_tokens for o in outs) > 0
    assert llm.engine.pool.num_free == 64


def test_gemma_default_ids_differ_from_the_first_id_rule():
    assert GEMMA_OUTPUT_IDS.capture_ids(None, 62) == (2, 31, 60)
    assert FIRST_ID_RULE.capture_ids(None, 62) == (2, 31, 59)
    # the public Gemma-3-27B and Gemma-4-26B-A4B drafts (SpecForge configs) capture the last layer's output
    assert GEMMA_OUTPUT_IDS.capture_ids((1, 29, 61), 62) == (2, 30, 62)
    assert GEMMA_OUTPUT_IDS.capture_ids((5, 17, 29), 30) == (6, 18, 30)
    assert FIRST_ID_RULE.capture_ids((5, 17, 29), 30) == (
        5,
        17,
        29,
    )  # what the first-id rule would capture
