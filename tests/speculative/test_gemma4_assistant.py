"""Gemma 4 assistant drafters (transformers Gemma4AssistantForCausalLM) on a tiny random Gemma 4 target
(fp32, CPU): draft steps equal transformers' class fed by its Gemma4ForCausalLM as its
SinglePositionMultiTokenCandidateGenerator feeds it (the target's shared KV, normed last hidden state and
scaled embedding, every step at one position, sliding layers past the window), with the plain and the
ordered-embedding head; greedy speculation is lossless (chains, several steps, chunked prefill, batching);
sampled tokens follow the target's exact joint (chi-square); gemma-4-12B's pair (a unified target and a
Gemma4UnifiedAssistantForCausalLM, the same model over a unified text config) drafts as transformers does."""

import pytest
import torch

from helpers.gemma_sampling import (
    GEMMA4_PROMPT,
    PARAMS,
    VOCAB,
    assert_follows_the_joint,
    make_gemma4_assistant,
    make_tiny_gemma,
    sampling_llm,
)
from helpers.gemma_sampling import GEMMA4_TINY as TARGET
from helpers.hf_models import save_hf_model
from helpers.stats import exact_joint
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context, uniform_paged_metadata
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.models.drafts.eagle3 import DraftMismatchError
from outpace.models.drafts.gemma4_assistant import load_gemma4_assistant
from outpace.models.loader import load_model
from outpace.validation import ConfigError

WINDOW = TARGET["sliding_window"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """helpers/gemma_models.py's 5-layer Gemma 4 (per-layer embeddings, windows of 7) with 12 tokens -> (model, directory)."""
    return make_tiny_gemma("gemma4", tmp_path_factory.mktemp("target"))


@pytest.fixture(scope="module")
def assistants(target, tmp_path_factory):
    """kind -> (transformers assistant, directory)."""
    out = {}
    for kind in ("plain", "ordered"):
        model = make_gemma4_assistant(ordered=kind == "ordered")
        out[kind] = (model, save_hf_model(model, tmp_path_factory.mktemp(kind)))
    return out


def transformers_draft(hf_target, hf_assistant, ids: list[int], steps: int):
    """transformers' draft after ids[:-1] were processed and ids[-1] is the last token, as
    SinglePositionMultiTokenCandidateGenerator.get_candidates computes it -> logits per step [steps, vocab]."""
    n = len(ids) - 1
    with torch.no_grad():
        out = hf_target(
            torch.tensor([ids[:n]]), output_hidden_states=True, return_shared_kv_states=True
        )
        hidden, kv, token = (
            out.hidden_states[-1][:, -1:],
            out.shared_kv_states,
            torch.tensor([[ids[-1]]]),
        )
        logits = []
        for _ in range(steps):
            x = torch.cat([hf_target.get_input_embeddings()(token), hidden], dim=-1)
            step = hf_assistant(
                inputs_embeds=x,
                attention_mask=torch.ones(1, n, dtype=torch.long),
                position_ids=torch.tensor([[n]]),
                shared_kv_states=kv,
                use_cache=False,
            )
            logits.append(step.logits[0, -1])
            token, hidden = step.logits.argmax(-1), step.last_hidden_state
    return torch.stack(logits)


def outpace_draft(target_dir, assistant_dir, ids: list[int], steps: int, block_size: int = 4):
    """The same draft from outpace's classes: the target's prefill over scattered blocks, then the steps
    with the query at KV row L - 1 -> (logits [steps, vocab], the assistant)."""
    n = len(ids) - 1
    model = load_model(target_dir, torch.float32)
    bind_kv_cache(model.model, BlockPool(12, block_size), torch.float32, "cpu")
    table = [7, 2, 9, 0, 5, 11, 3][: -(-n // block_size)]
    assistant = load_gemma4_assistant(assistant_dir, model, torch.float32, "cpu")
    with torch.no_grad():
        with forward_context(build_paged_metadata([table], [0], [n], block_size, "cpu")):
            last = model(torch.tensor(ids[:n]), torch.arange(n)).hidden_states[-1:]
        hidden, token, logits = assistant.target_state(last), torch.tensor([ids[-1]]), []
        with forward_context(
            uniform_paged_metadata(torch.tensor([table]), torch.tensor([n - 1]), 1, block_size)
        ):
            for _ in range(steps):
                step_logits, hidden = assistant(token, torch.tensor([n]), hidden)
                logits.append(step_logits[0])
                token = step_logits.argmax(-1)
    return torch.stack(logits), assistant


@pytest.mark.parametrize("kind", ["plain", "ordered"])
@pytest.mark.parametrize("length", [5, 17], ids=["inside-window", "past-window"])
def test_steps_match_transformers(kind, length, target, assistants):
    hf_assistant, path = assistants[kind]
    ids = GEMMA4_PROMPT[:length]
    expected = transformers_draft(target[0], hf_assistant, ids, 3)
    got, _ = outpace_draft(target[1], path, ids, 3)
    chosen = torch.isfinite(
        got
    )  # ordered: the tokens of the chosen clusters (transformers fills the others)
    assert chosen.equal(
        torch.ones_like(chosen) if kind == "plain" else expected > expected.min(-1, True).values
    )
    torch.testing.assert_close(got[chosen], expected[chosen], rtol=1e-4, atol=1e-4)
    assert got.argmax(-1).equal(expected.argmax(-1))
    assert not torch.allclose(got[0], got[1]), "the second step ignored the first one's state"


@pytest.fixture(scope="module")
def unified(tmp_path_factory):
    """gemma-4-12B's pair in small: a unified Gemma 4 target (no per-layer embeddings) and a
    Gemma4UnifiedAssistantForCausalLM -> (target model, its directory, assistant model, its directory)."""
    model, path = make_tiny_gemma("gemma4-unified", tmp_path_factory.mktemp("unified"))
    assistant = make_gemma4_assistant(unified=True)
    return model, path, assistant, save_hf_model(assistant, tmp_path_factory.mktemp("assistant"))


def test_a_unified_assistant_drafts_as_transformers_and_losslessly(unified, plain_tokens):
    hf_target, target_dir, hf_assistant, path = unified
    expected = transformers_draft(hf_target, hf_assistant, GEMMA4_PROMPT, 3)
    got, _ = outpace_draft(target_dir, path, GEMMA4_PROMPT, 3)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    prompts = plain_tokens[0]
    plain = LLM(str(target_dir), block_size=4).generate(prompts, GREEDY)
    spec = LLM(
        str(target_dir),
        block_size=4,
        num_kv_blocks=64,
        speculative=SpeculativeConfig("gemma4_assistant", str(path), num_steps=3),
    ).generate(prompts, GREEDY)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]
    assert sum(o.spec_metrics.num_accepted_drafts for o in spec) > 0


def test_sliding_layers_see_the_window_plus_one(target, assistants, monkeypatch):
    """The last sliding_window + 1 target keys (transformers' flipped bidirectional mask): one key fewer
    or more changes the draft."""
    hf_assistant, path = assistants["plain"]
    expected = transformers_draft(target[0], hf_assistant, GEMMA4_PROMPT, 1)
    from outpace.models.drafts import gemma4_assistant

    init = gemma4_assistant.TargetCacheAttention.__init__
    for shift in (-1, 1):

        def shifted(self, source, heads, window, shift=shift):
            init(self, source, heads, None if window is None else window + shift)

        monkeypatch.setattr(gemma4_assistant.TargetCacheAttention, "__init__", shifted)
        got, _ = outpace_draft(target[1], path, GEMMA4_PROMPT, 1)
        assert not torch.allclose(got, expected, rtol=1e-4, atol=1e-4), (
            f"window {WINDOW + 1 + shift} fits too"
        )


def test_mismatched_assistant_is_refused(target, tmp_path):
    wide = make_gemma4_assistant(head_dim=16, global_head_dim=16)
    with pytest.raises(DraftMismatchError, match="head_dim"):
        outpace_draft(target[1], save_hf_model(wide, tmp_path / "wide"), GEMMA4_PROMPT, 1)
    with pytest.raises(ConfigError, match="topk"):
        LLM(
            str(target[1]),
            speculative=SpeculativeConfig(
                "gemma4_assistant", str(tmp_path / "wide"), num_steps=2, topk=2, num_draft_tokens=4
            ),
        )


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_tokens(target):
    prompts = [GEMMA4_PROMPT, GEMMA4_PROMPT[4:11], [5, 5, 2]]
    return prompts, [
        o.token_ids for o in LLM(str(target[1]), block_size=4).generate(prompts, GREEDY)
    ]


@pytest.mark.parametrize("kind,steps", [("plain", 1), ("plain", 3), ("ordered", 4)])
def test_greedy_is_lossless(kind, steps, target, assistants, plain_tokens):
    """Chunked prefill (chunks of 8 rows), three requests at once, every verify past the window."""
    prompts, expected = plain_tokens
    llm = LLM(
        str(target[1]),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=8,
        speculative=SpeculativeConfig(
            "gemma4_assistant", str(assistants[kind][1]), num_steps=steps
        ),
    )
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
    drafted = sum(o.spec_metrics.num_draft_tokens for o in outs)
    assert 0 < accepted < drafted, (accepted, drafted)
    assert llm.engine.pool.num_free == 64


def test_engine_drafts_are_transformers_drafts(target, assistants, monkeypatch):
    """Every chain the engine drafts (after prefill and after each verify, whatever was accepted) equals
    transformers' greedy draft from the committed tokens."""
    from outpace.speculative.drafters.gemma4_assistant import Gemma4AssistantProposer

    hf_assistant, path = assistants["plain"]
    seen = []
    draft = Gemma4AssistantProposer.draft

    def recording(self, rows, shape):
        out = draft(self, rows, shape)
        seen.append((rows.lengths[0].item(), out.token_ids[0].tolist()))
        return out

    monkeypatch.setattr(Gemma4AssistantProposer, "draft", recording)
    llm = LLM(
        str(target[1]),
        block_size=4,
        num_kv_blocks=64,
        speculative=SpeculativeConfig("gemma4_assistant", str(path), num_steps=3),
    )
    tokens = (
        GEMMA4_PROMPT[:9]
        + llm.generate([GEMMA4_PROMPT[:9]], GREEDY.replace(max_tokens=16))[0].token_ids
    )
    assert len(seen) > 3
    for length, chain in seen:
        assert chain[0] == tokens[length]
        expected = (
            transformers_draft(target[0], hf_assistant, tokens[: length + 1], 3).argmax(-1).tolist()
        )
        assert chain[1:] == expected, length


@pytest.mark.parametrize("kind", ["plain", "ordered"])
def test_sampling_follows_the_target_distribution(kind, target, assistants):
    """Sampled drafts (q from the assistant's logits under the request's sampling) verified by rejection."""
    prompt = GEMMA4_PROMPT[:10]
    llm = sampling_llm(
        target[1], SpeculativeConfig("gemma4_assistant", str(assistants[kind][1]), num_steps=3)
    )
    assert_follows_the_joint(llm, prompt, exact_joint(target[1], prompt, PARAMS, VOCAB), 0.05)
