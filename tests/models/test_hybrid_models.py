"""Hybrid targets (models/qwen3_next.py: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE, text models and multimodal checkpoints;
models/nemotron_h.py: Nemotron-H)
against transformers on random weights (fp32, CPU, tiny odd shapes: grouped value heads, partial RoPE,
Mamba groups, MoE), and the recurrent layers' tree form against their chain form.

transformers' cached decoding of these classes is a different code path from its prefill (and its
multi-token cached path does not carry every state), so the greedy references here recompute the whole
sequence for every token."""

import pytest
import torch

from helpers.hf_models import checkpoint_cache, paged_prefill_error
from helpers.hybrid_models import HYBRIDS, make_hybrid, save_hybrid
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.layers.causal_conv import causal_conv_run
from outpace.layers.gated_deltanet import gated_delta_rule_run
from outpace.layers.mamba2 import ssm_run
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.validation import ConfigError

PROMPTS = [[3, 17, 99, 100, 8, 42, 7], [5, 9], [(i * 7) % 131 for i in range(13)]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return checkpoint_cache(tmp_path_factory, make_hybrid, save_hybrid)


def greedy_by_recomputation(hf, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_prefill_logits_match_transformers(variant, checkpoints):
    hf, path = checkpoints(variant)
    rel = paged_prefill_error(hf, path, 131)
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.mark.parametrize("variant", list(HYBRIDS))
def test_one_forward_of_mixed_lengths_matches_each_alone(variant, checkpoints):
    """Three sequences of different lengths in one forward: each run's padding leaves its state alone."""
    hf, path = checkpoints(variant)
    model = load_model(path, torch.float32)
    bind_kv_cache(model.model, BlockPool(16, 4), torch.float32, "cpu")
    lengths = [11, 3, 7]
    meta = build_paged_metadata([[0, 1, 2], [3], [4, 5]], [0, 0, 0], lengths, 4, "cpu")
    ids = torch.cat(
        [torch.tensor(p[:n] + [1] * (n - len(p))) for p, n in zip(PROMPTS[::-1], lengths)]
    )
    with torch.no_grad(), forward_context(meta):
        logits = model.compute_logits(
            model(ids, torch.cat([torch.arange(n) for n in lengths])).hidden_states
        )
        refs = torch.cat([hf(part[None]).logits[0] for part in ids.split(lengths)])
    rel = ((logits - refs).norm() / refs.norm()).item()
    assert rel < 1e-4, f"{variant}: relative error {rel}"


@pytest.fixture(scope="module")
def references(checkpoints):
    cache = {}

    def get(variant):
        if variant not in cache:
            hf, _ = checkpoints(variant)
            cache[variant] = [greedy_by_recomputation(hf, p, 32) for p in PROMPTS]
        return cache[variant]

    return get


@pytest.mark.parametrize("variant", list(HYBRIDS))
@pytest.mark.parametrize("budget", [2, 5, 64])
def test_greedy_tokens_match_transformers_chunked_and_batched(
    variant, budget, checkpoints, references
):
    """32 greedy tokens, the three prompts batched; a token budget of 2 or 5 cuts the prompts into chunks
    whose boundaries fall inside the convolution's 4-token window (2: chunks shorter than the window)."""
    _, path = checkpoints(variant)
    llm = LLM(str(path), block_size=4, num_kv_blocks=64, max_num_batched_tokens=budget)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    assert [o.token_ids for o in outs] == references(variant)


def test_state_is_counted_per_slot(checkpoints):
    _, path = checkpoints("qwen3_5")
    runner = LLM(str(path), block_size=4, num_kv_blocks=32, max_num_seqs=3).engine.runner
    states = runner.states
    # 2 gated DeltaNet layers: conv [3, 2 * 16 + 24] (fp32) + state [4, 8, 6] fp32, and one snapshot row each
    per_layer = (3 * 56 + 4 * 8 * 6) * 4
    assert states.bytes_per_request == 2 * 2 * per_layer
    assert states.state_bytes_per_request == 2 * per_layer
    # max_num_seqs + the padding slot, and max_num_seqs prefix checkpoints (a state each, no snapshot)
    assert states.nbytes == 4 * states.bytes_per_request + 3 * states.state_bytes_per_request


QWEN35 = dict(
    architectures=["Qwen3_5ForCausalLM"],
    vocab_size=11,
    hidden_size=8,
    intermediate_size=8,
    num_hidden_layers=6,
    num_attention_heads=2,
    num_key_value_heads=2,  # (Qwen3_5TextConfig's default is 4)
    head_dim=8,
    linear_num_key_heads=1,
    linear_num_value_heads=2,
    linear_key_head_dim=4,
    linear_value_head_dim=4,
)
NEMOTRON = dict(
    architectures=["NemotronHForCausalLM"],
    vocab_size=11,
    hidden_size=8,
    intermediate_size=8,
    num_attention_heads=2,
    num_key_value_heads=2,  # (NemotronHConfig's default is 8)
    head_dim=4,
    mamba_num_heads=2,
    mamba_head_dim=4,
    n_groups=1,
    ssm_state_size=4,
    n_routed_experts=2,
    num_experts_per_tok=1,
    moe_intermediate_size=4,
    moe_shared_expert_intermediate_size=4,
)


def test_layer_pattern_comes_from_the_config():
    from outpace.models.nemotron_h import NemotronHForCausalLM
    from outpace.models.qwen3_next import Qwen3NextConfig

    hybrid = Qwen3NextConfig.from_model_config(
        ModelConfig.from_dict({**QWEN35, "full_attention_interval": 3})
    )
    assert hybrid.layer_types == ("linear_attention", "linear_attention", "full_attention") * 2
    assert hybrid.rotary_dim == 2  # partial_rotary_factor: 0.25 unless the config says otherwise
    cfg = ModelConfig.from_dict({**NEMOTRON, "hybrid_override_pattern": "M*-EM"})
    assert cfg.num_hidden_layers == 5
    model = NemotronHForCausalLM(cfg)
    assert [b.kind for b in model.model.layers] == [
        "linear_attention",
        "full_attention",
        "mlp",
        "moe",
        "linear_attention",
    ]


@pytest.mark.parametrize(
    "field, value",
    [
        ("moe_latent_size", 0),
        ("mamba_ssm_cache_dtype", "bfloat16"),
        ("sliding_window", 16),
        ("hybrid_override_pattern", "M*X"),
    ],
)
def test_unimplemented_nemotron_values_are_refused_by_name(field, value):
    from outpace.models.nemotron_h import NemotronHForCausalLM

    raw = {**NEMOTRON, "hybrid_override_pattern": "M*", field: value}
    with pytest.raises(ConfigError, match=field):
        NemotronHForCausalLM(
            ModelConfig.from_dict({**raw, "num_hidden_layers": len(raw["hybrid_override_pattern"])})
        )


def test_unimplemented_qwen_values_are_refused_by_name():
    from outpace.models.qwen3_next import Qwen3NextConfig

    with pytest.raises(ConfigError, match="layer_types"):
        Qwen3NextConfig.from_model_config(
            ModelConfig.from_dict({**QWEN35, "layer_types": ["sliding_attention"] * 6})
        )
    with pytest.raises(ConfigError, match="linear_num_value_heads"):
        Qwen3NextConfig.from_model_config(
            ModelConfig.from_dict(
                {**QWEN35, "linear_num_value_heads": 3, "linear_num_key_heads": 2}
            )
        )


@pytest.mark.parametrize(
    "field, value",
    [("mlp_only_layers", [1]), ("decoder_sparse_step", 2), ("norm_topk_prob", False)],
)
def test_qwen35_moe_refuses_the_qwen3_next_fields_it_lacks(field, value):
    """transformers' Qwen3_5MoeTextConfig drops these (every layer a mixture, weights always renormalised): a
    Qwen3.5-MoE config setting one otherwise is refused by name, not served as Qwen3-Next would read it."""
    from outpace.models.qwen3_next import Qwen3NextConfig

    moe = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4)
    raw = {**QWEN35, **moe, "architectures": ["Qwen3_5MoeForCausalLM"], field: value}
    with pytest.raises(ConfigError, match=field):
        Qwen3NextConfig.from_model_config(ModelConfig.from_dict(raw))


def test_a_multimodal_qwen35_checkpoint_serves_its_text_model(checkpoints, caplog):
    """The hub's Qwen3.5 checkpoints hold a vision tower (model.visual) and the text model under
    model.language_model: loading skips the tower with a logged note."""
    import logging

    from outpace.checkpoint import checkpoint_tensor_names

    _, path = checkpoints("qwen3_5_moe-multimodal")
    assert any(n.startswith("model.visual.") for n in checkpoint_tensor_names(path))
    with caplog.at_level(logging.INFO, logger="outpace.models"):
        model = load_model(path, torch.float32)
    assert "model.visual.*" in caplog.text and "skipped" in caplog.text
    assert not any("visual" in n for n, _ in model.named_parameters())


# ---- the recurrent layers' tree form: node i continues its parent's state -------------------------------
TREE = torch.tensor(
    [[-1, 0, 0, 1, 3, 2], [-1, 0, 1, 2, 3, 4]]
)  # [runs, nodes]: a branching tree, a chain


def root_path(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def check_tree_equals_its_paths(run, inputs, state):
    """``run(inputs, state, parents)`` -> (per-token output, every state); each node's output and state must
    be those of the chain of its root path."""
    out, every = run(inputs, state, TREE)
    for r, parents in enumerate(TREE.tolist()):
        for node in range(len(parents)):
            path = root_path(parents, node)
            chain_out, chain_every = run(
                [x[r : r + 1, path] for x in inputs], state[r : r + 1], None
            )
            torch.testing.assert_close(out[r, node], chain_out[0, -1], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(every[r, node], chain_every[0, -1], rtol=1e-5, atol=1e-6)


def test_conv_tree_nodes_continue_their_parents():
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(5, 4, generator=g), torch.randn(5, generator=g)

    def run(inputs, state, parents):
        (x,) = inputs
        y, _, every = causal_conv_run(
            x, state, weight, bias, torch.ones(x.shape[:2], dtype=torch.bool), parents, True
        )
        return y, every

    check_tree_equals_its_paths(
        run, [torch.randn(2, 6, 5, generator=g)], torch.randn(2, 3, 5, generator=g)
    )


def test_delta_rule_tree_nodes_continue_their_parents():
    g = torch.Generator().manual_seed(1)
    shape = (2, 6)

    def run(inputs, state, parents):
        q, k, v, decay, beta = inputs
        o, _, every = gated_delta_rule_run(
            q, k, v, decay, beta, state, torch.ones(q.shape[:2], dtype=torch.bool), parents, True
        )
        return o, every

    inputs = [
        torch.randn(*shape, 2, 4, generator=g),
        torch.randn(*shape, 2, 4, generator=g),
        torch.randn(*shape, 4, 3, generator=g),
        -torch.rand(*shape, 4, generator=g),
        torch.rand(*shape, 4, generator=g),
    ]
    check_tree_equals_its_paths(run, inputs, torch.randn(2, 4, 4, 3, generator=g))


def test_ssm_tree_nodes_continue_their_parents():
    g = torch.Generator().manual_seed(2)
    shape = (2, 6)
    A, D = -torch.rand(4, generator=g), torch.randn(4, generator=g)

    def run(inputs, state, parents):
        x, dt, B, C = inputs
        y, _, every = ssm_run(
            x, dt, A, B, C, D, state, torch.ones(x.shape[:2], dtype=torch.bool), parents, True
        )
        return y, every

    inputs = [
        torch.randn(*shape, 4, 3, generator=g),
        torch.rand(*shape, 4, generator=g),
        torch.randn(*shape, 2, 5, generator=g),
        torch.randn(*shape, 2, 5, generator=g),
    ]
    check_tree_equals_its_paths(run, inputs, torch.randn(2, 4, 3, 5, generator=g))


def test_padding_keeps_the_state():
    """A run shorter than the forward's longest ends with the state after its own last token."""
    g = torch.Generator().manual_seed(3)
    x, state, weight = (
        torch.randn(2, 7, 5, generator=g),
        torch.randn(2, 3, 5, generator=g),
        torch.randn(5, 4, generator=g),
    )
    valid = torch.arange(7) < torch.tensor([[7], [2]])
    _, final, _ = causal_conv_run(x, state, weight, None, valid, None, False)
    _, alone, _ = causal_conv_run(x[1:, :2], state[1:], weight, None, valid[1:, :2], None, False)
    torch.testing.assert_close(final[1], alone[0])
    torch.testing.assert_close(final[1], torch.cat((state[1, 2:], x[1, :2])))
