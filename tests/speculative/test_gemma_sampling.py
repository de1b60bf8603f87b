"""Sampling with EAGLE3 drafts on Gemma 3 and Gemma 4 targets (fp32, CPU, random weights): the first three
tokens the engine emits follow the target's exact joint distribution (chi-square), for chains and trees.
The targets are test_gemma.py's (sliding windows of 7, softcapping, Gemma 4's per-layer embeddings) with a
12-token vocabulary, so that random drafts are accepted now and then; the prompt is longer than the window.
``assert_follows_the_joint`` serves the Gemma 4 assistant's sampling test too (test_gemma4_assistant.py)."""
import pytest
import torch
import transformers

from helpers.hf_models import save_hf_model
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig
from helpers.spec_models import make_eagle3_draft
from helpers.stats import chi_square_p_value, exact_joint
from test_gemma import GEMMA3_TEXT, GEMMA4_TEXT

VOCAB, TRIALS = 12, 3000
PROMPT = [3, 1, 9, 10, 8, 4, 7, 3, 1, 6]  # 10 tokens: past the window of 7
PARAMS = SamplingParams(temperature=0.8, top_k=3, max_tokens=3, ignore_eos=True)
# softcapping at 0.5 would leave nearly uniform distributions: a wrong sampler could hide in them
GEMMA3_TINY = dict(GEMMA3_TEXT, vocab_size=VOCAB, final_logit_softcapping=3.0)
GEMMA4_TINY = dict(GEMMA4_TEXT, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB, final_logit_softcapping=3.0)
CONFIGS = {"gemma3": lambda: transformers.Gemma3TextConfig(**GEMMA3_TINY),
           "gemma4": lambda: transformers.Gemma4TextConfig(**GEMMA4_TINY)}
SHAPES = {"chain": dict(num_steps=3), "tree": dict(num_steps=3, topk=2, num_draft_tokens=6)}


def make_tiny_gemma(variant: str, path):
    """test_gemma.py's target with the small vocabulary, saved under ``path`` -> (transformers model, path)."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[variant](), dtype=torch.float32)
    with torch.no_grad():  # every weight matters (norms, scalars and biases start at 0 or 1)
        for name, t in model.state_dict().items():
            if "norm" in name or "scal" in name or name.endswith("bias"):
                t.add_(torch.randn_like(t) * 0.1)
    return model.eval(), save_hf_model(model.eval(), path)


def assert_follows_the_joint(llm: LLM, prompt: list[int], joint: torch.Tensor, min_accepted: float) -> None:
    outs = llm.generate([prompt] * TRIALS, PARAMS)
    emitted = torch.tensor([o.token_ids for o in outs])                                 # [TRIALS, 3]
    index = (emitted[:, 0] * VOCAB + emitted[:, 1]) * VOCAB + emitted[:, 2]
    p = chi_square_p_value(torch.bincount(index, minlength=VOCAB ** 3), TRIALS * joint)
    assert p > 1e-3, f"p = {p:.2e}"
    accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
    assert accepted > min_accepted * TRIALS, f"{accepted} drafts accepted: speculation hardly ran"


def sampling_llm(target_dir, spec: SpeculativeConfig) -> LLM:
    return LLM(str(target_dir), block_size=4, num_kv_blocks=4096, max_num_seqs=1024, max_num_batched_tokens=8192,
               seed=11, speculative=spec)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """variant -> (target directory, its exact joint, an EAGLE3 draft directory)."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            root = tmp_path_factory.mktemp(variant)
            _, path = make_tiny_gemma(variant, root / "target")
            draft = make_eagle3_draft(path, root / "eagle3", draft_vocab_size=10, aux_ids=[1, 2, 4], seed=3,
                                      use_aux_norm=True, target_model_type="gemma3_text")
            cache[variant] = (path, exact_joint(path, PROMPT, PARAMS, VOCAB), draft)
        return cache[variant]

    return get


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_eagle3_sampling_follows_the_target_distribution(variant, shape, gemma):
    path, joint, draft = gemma(variant)
    llm = sampling_llm(path, SpeculativeConfig("eagle3", str(draft), **SHAPES[shape]))
    assert_follows_the_joint(llm, PROMPT, joint, 0.05)
