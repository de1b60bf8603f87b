"""DeepSeek-V2/V3 targets (models/deepseek.py) against transformers' DeepseekV2/V3ForCausalLM on random
weights (fp32, CPU): prefill logits in both attention forms over the latent cache, greedy tokens batched and
through chunked prefill, tree-verify masks; the MTP layer against a reference assembled from transformers'
DeepSeek-V3 pieces with vLLM deepseek_mtp.py's semantics; lossless speculation (MTP, n-gram, the oracle's
chains and trees, sampling); block accounting; every config field decided on."""

import json

import pytest
import torch
import transformers

from helpers.config_walk import COMMON_IRRELEVANT
from helpers.deepseek_models import (
    SMALL,
    SPEC_PROMPTS,
    VARIANTS,
    YARN,
    make_hf_deepseek,
    paged_logits,
    save_v3_with_mtp,
    write_kimi_k25,
)
from helpers.hf_models import checkpoint_cache, make_hf_model, save_hf_model
from helpers.oracle_proposer import OracleProposer
from helpers.stats import chi_square_p_value, joint_of_three
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.layers.rotary import _inverse_frequencies, rope_attention_factor
from outpace.layers.sampler import SamplingTensors, logits_to_probs
from outpace.model_config import ModelConfig
from outpace.models.deepseek import DeepseekConfig
from outpace.models.loader import load_model
from outpace.registry import PROPOSERS
from outpace.validation import ConfigError

PROPOSERS["oracle"] = "helpers.oracle_proposer:OracleProposer"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """variant -> (transformers model, directory of its saved checkpoint)."""
    return checkpoint_cache(tmp_path_factory, make_hf_deepseek)


def set_expand_threshold(model, query_len) -> None:
    """Force the attention form: expanded from ``query_len`` queries per sequence on (1: always expanded,
    a huge value: always absorbed)."""
    for module in model.modules():
        if hasattr(module, "expand_min_query_len"):
            module.expand_min_query_len = query_len


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("form", ["absorbed", "expanded"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_logits_match_transformers(variant, form, checkpoints):
    hf, path = checkpoints(variant)
    model = load_model(path, torch.float32)
    set_expand_threshold(model, 1 if form == "expanded" else 10**9)
    ids = torch.randint(0, SMALL["vocab_size"], (45,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        logits = paged_logits(model, ids)
    assert rel_error(logits, ref) < 1e-4, variant


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_tokens_match_transformers_batched_and_chunked(variant, checkpoints):
    """Several prompts at once; then chunked prefill (chunks of 16 tokens: the expanded form over cached
    prefixes, shorter ones absorbed); decode is always absorbed."""
    hf, path = checkpoints(variant)
    prompts = [
        [3, 17, 99, 150, 8, 42, 7],
        list(range(100, 119)),
        [(i * 37) % 203 for i in range(33)],
    ]
    with torch.no_grad():
        # (an explicit attention mask: generate would take the prompt's token 0 for padding)
        refs = [
            hf.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.int64),
                max_new_tokens=32,
                do_sample=False,
                min_new_tokens=32,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p in prompts
        ]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    for chunk in (2048, 16):
        outs = LLM(
            str(path), block_size=4, num_kv_blocks=128, max_num_batched_tokens=chunk
        ).generate(prompts, params)
        assert [o.token_ids for o in outs] == refs, f"{variant}, chunks of {chunk}"


def test_a_kimi_k25_checkpoint_serves_its_deepseek_v3_text_model(checkpoints, tmp_path, caplog):
    """Kimi-K2.5's multimodal layout loads as its DeepSeek-V3 text model (V3's routing and MLA), the tower and
    projector skipped with a logged note: the same prefill logits and greedy tokens as the V3 checkpoint."""
    import logging

    hf, path = checkpoints("v3-yarn")
    kimi = write_kimi_k25(path, tmp_path / "kimi")
    with caplog.at_level(logging.INFO, logger="outpace.models"):
        model = load_model(kimi, torch.float32)
    assert "vision_tower.*" in caplog.text and "mm_projector.*" in caplog.text
    assert model.deepseek_config.version == 3
    ids = torch.randint(0, SMALL["vocab_size"], (30,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        assert rel_error(paged_logits(model, ids), ref) < 1e-4
    prompts, params = [[3, 17, 99, 150, 8], [42, 7]], SamplingParams(temperature=0, max_tokens=12)
    plain = LLM(str(path), block_size=4).generate(prompts, params)
    assert [o.token_ids for o in LLM(str(kimi), block_size=4).generate(prompts, params)] == [
        o.token_ids for o in plain
    ]


def test_tree_verify_rows_match_their_causal_paths(checkpoints):
    """A draft tree verified in one forward (custom ancestor mask, rows at tree depths) gives each node the
    logits that a causal forward over the prefix and the node's root path gives its last token: both forms."""
    _, path = checkpoints("v3-yarn")
    model = load_model(path, torch.float32)
    prefix = torch.randint(
        0, SMALL["vocab_size"], (10,), generator=torch.Generator().manual_seed(2)
    )
    tree = torch.tensor([11, 22, 33, 44, 55, 66])  # node tokens
    parents, depths = [-1, 0, 0, 1, 1, 2], [0, 1, 1, 2, 2, 2]
    mask = torch.eye(6, dtype=torch.bool)
    for i in range(1, 6):
        mask[i] |= mask[parents[i]]
    for form in ("absorbed", "expanded"):
        set_expand_threshold(model, 1 if form == "expanded" else 10**9)
        with torch.no_grad():
            bind_kv_cache(model, BlockPool(8, 4), torch.float32, "cpu")
            paged_logits(model, prefix, blocks=(3, 6, 1, 4), block_size=4)
            meta = build_paged_metadata([[3, 6, 1, 4]], [10], [6], 4, "cpu", custom_masks=[mask])
            with forward_context(meta):
                out = model(tree, 10 + torch.tensor(depths)).hidden_states
                tree_logits = model.compute_logits(out)
            for i in range(6):
                path, node = [], i
                while node >= 0:
                    path.insert(0, tree[node].item())
                    node = parents[node]
                bind_kv_cache(model, BlockPool(8, 4), torch.float32, "cpu")
                causal = paged_logits(
                    model, torch.cat([prefix, torch.tensor(path)]), (0, 1, 2, 3), block_size=4
                )[-1]
                assert rel_error(tree_logits[i], causal) < 1e-5, (form, i)


def test_latent_cache_is_one_row_per_token(checkpoints):
    """bind_kv_cache gives each MLA layer [num_blocks + 1, block_size, 1, kv_lora_rank] and [.., 1,
    qk_rope_head_dim] views of one [.., 1, kv_lora_rank + qk_rope_head_dim] allocation: no per-head K/V."""
    _, path = checkpoints("v3-yarn")
    model = load_model(path, torch.float32)
    caches = bind_kv_cache(model.model, BlockPool(8, 4), torch.float32, "cpu")
    assert len(caches) == SMALL["num_hidden_layers"]
    for latent, rope in caches:
        assert latent.shape == (9, 4, 1, 36) and rope.shape == (9, 4, 1, 8)
        assert latent.untyped_storage().data_ptr() == rope.untyped_storage().data_ptr()
        assert latent.untyped_storage().nbytes() == 9 * 4 * (36 + 8) * 4
        flat = rope.view(-1, *rope.shape[2:])  # what the engine's tree commit does to each tensor
        flat[torch.tensor([5])] = flat[torch.tensor([1])] + 1
        assert rope[1, 1].eq(1).all() and latent[1, 1].eq(0).all()


def test_yarn_tables_match_transformers():
    """YaRN inverse frequencies and cos/sin scale (attention_factor) as transformers computes them, for a
    Llama config and DeepSeek's (head_dim: qk_rope_head_dim), with and without mscale."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    without_mscale = {k: v for k, v in YARN.items() if not k.startswith("mscale")}
    for rope in (
        YARN,
        without_mscale,
        {**YARN, "beta_fast": 16, "truncate": False},
        {**YARN, "attention_factor": 1.3},
    ):
        for cfg in (
            transformers.LlamaConfig(
                hidden_size=64, num_attention_heads=4, rope_parameters=dict(rope)
            ),
            transformers.DeepseekV3Config(**{**SMALL, "rope_parameters": dict(rope)}),
        ):
            inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](cfg)
            ours = _inverse_frequencies(cfg.head_dim, 10000.0, rope)
            torch.testing.assert_close(ours, inv_freq, rtol=1e-6, atol=0)
            assert rope_attention_factor(rope) == pytest.approx(factor, rel=1e-12)


def test_llama_with_yarn_matches_transformers(tmp_path):
    hf = make_hf_model(
        "llama", rope_parameters={k: v for k, v in YARN.items() if not k.startswith("mscale")}
    )
    model = load_model(save_hf_model(hf, tmp_path), torch.float32)
    ids = torch.randint(0, 203, (40,), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        bind_kv_cache(model, BlockPool(8, 16), torch.float32, "cpu")
        assert rel_error(paged_logits(model, ids), hf(ids[None]).logits[0]) < 1e-4


# ---- MTP -----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    return save_v3_with_mtp(tmp_path_factory.mktemp("v3-mtp"))


def test_mtp_layer_matches_the_reference(mtp_target, checkpoints):
    hf, ref, path = mtp_target
    model = load_model(path, torch.float32)
    layer = model.mtp_layers[0]
    assert (
        type(layer.mlp).__name__ == "MoE"
    )  # layer index 3 >= first_k_dense_replace, as DeepSeek-V3's 61
    ids = torch.randint(0, 13, (30,), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = ref(hf, ids)
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        bind_kv_cache(model.mtp_layers, BlockPool(8, 16), torch.float32, "cpu")
        meta = build_paged_metadata([[1, 2]], [0], [30], 16, "cpu")
        with forward_context(meta):
            hidden = model(ids, torch.arange(30)).hidden_states  # pre-norm
        meta = build_paged_metadata([[1, 2]], [0], [29], 16, "cpu")
        with forward_context(meta):
            out = layer(torch.arange(29), ids[1:], layer.target_state(model, hidden[:-1]), model)
            logits = layer.compute_logits(model, out)
    assert rel_error(logits, expected) < 1e-4
    # a checkpoint without MTP tensors (transformers' save_pretrained) has no MTP layers
    plain = load_model(checkpoints("v3-yarn")[1], torch.float32)
    assert plain.config.num_nextn_predict_layers == 0 and not hasattr(plain, "mtp_layers")
    # while its config.json counts one: --method mtp says which
    assert (
        json.loads((checkpoints("v3-yarn")[1] / "config.json").read_text())[
            "num_nextn_predict_layers"
        ]
        == 1
    )
    with pytest.raises(
        ConfigError, match="counts num_nextn_predict_layers = 1 but its tensors hold no MTP"
    ):
        LLM(str(checkpoints("v3-yarn")[1]), speculative=SpeculativeConfig("mtp", num_steps=1))


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
SPECS = {
    "mtp-1": SpeculativeConfig("mtp", num_steps=1),
    "mtp-3": SpeculativeConfig("mtp", num_steps=3),
    "ngram": SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    "oracle-chain": SpeculativeConfig("oracle", None, num_steps=4),
    "oracle-tree": SpeculativeConfig("oracle", None, num_steps=3, topk=2, num_draft_tokens=6),
}


@pytest.fixture(scope="module")
def plain_outputs(mtp_target):
    outs = LLM(str(mtp_target[2]), block_size=4).generate(
        SPEC_PROMPTS, GREEDY.replace(max_tokens=60)
    )
    return [o.token_ids for o in outs]


@pytest.mark.parametrize("method", list(SPECS))
def test_greedy_speculation_is_lossless(method, mtp_target, plain_outputs, monkeypatch):
    monkeypatch.setattr(
        OracleProposer, "references", {tuple(p): o for p, o in zip(SPEC_PROMPTS, plain_outputs)}
    )
    monkeypatch.setattr(OracleProposer, "vocab_size", 13)
    llm = LLM(
        str(mtp_target[2]),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=16,
        speculative=SPECS[method],
    )
    outs = llm.generate(SPEC_PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == [o[: GREEDY.max_tokens] for o in plain_outputs]
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0, "no draft was ever accepted"
    assert llm.engine.pool.num_free == 64


def test_preemption_and_abort_return_every_latent_block(mtp_target):
    """A pool of 10 blocks of 4 tokens forces preemption; one request is aborted mid-run: every block of the
    latent cache (target and MTP layers share the pool's block tables) comes back, and the requests that
    ran to the end produce the plain tokens."""
    prompts = SPEC_PROMPTS[:2] + [
        [(i * 5) % 13 for i in range(9)],
        [(i * 3) % 13 for i in range(7)],
    ]
    expected = [
        o.token_ids
        for o in LLM(str(mtp_target[2]), block_size=4).generate(
            prompts[:3], GREEDY.replace(max_tokens=16)
        )
    ]
    for spec in (SpeculativeConfig(), SPECS["mtp-3"]):
        llm = LLM(
            str(mtp_target[2]),
            block_size=4,
            num_kv_blocks=10,
            max_num_batched_tokens=8,
            speculative=spec,
        )
        engine = llm.engine
        ids = [engine.add_request(p, GREEDY.replace(max_tokens=16)) for p in prompts]
        done, step = {}, 0
        while engine.has_unfinished_requests:
            if step == 3:
                engine.abort_request(ids[3])
            done.update({o.request_id: o for o in engine.step()})
            step += 1
            in_use = sum(len(engine.pool.table(r.request_id)) for r in engine.scheduler.running)
            assert engine.pool.num_free + in_use == engine.pool.num_blocks
        assert engine.pool.num_free == 10
        assert sum(done[i].metrics.num_preemptions for i in ids[:3]) > 0, (
            "the pool was meant to force preemption"
        )
        assert [done[i].token_ids for i in ids[:3]] == expected


@pytest.mark.parametrize("method", ["mtp", "ngram"])
def test_sampling_follows_the_target_distribution(method, mtp_target):
    """The first three sampled tokens (the last two through MTP or n-gram drafts and verify) follow the
    target's own joint distribution (chi-square; top-k 3 keeps the joint to 27 cells)."""
    path, prompt, trials, vocab = mtp_target[2], [1, 5, 2, 7, 3], 3000, 13
    params = SamplingParams(temperature=0.8, top_k=3, top_p=0.95, max_tokens=3, ignore_eos=True)
    model = load_model(path, torch.float32)
    st = SamplingTensors.from_params([params], "cpu")
    bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")

    def next_probs(seq: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return logits_to_probs(paged_logits(model, torch.tensor(seq))[-1:], st)[0].double()

    joint = joint_of_three(next_probs, prompt, vocab)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=4096,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        seed=7,
        # (n-grams from one token: ngram's drafts are then proposed in a 3-token output)
        speculative=SpeculativeConfig(
            method, num_steps=2, **({"ngram_min": 1} if method == "ngram" else {})
        ),
    )
    outs = llm.generate([prompt] * trials, params)
    emitted = torch.tensor([o.token_ids for o in outs])  # [trials, 3]
    counts = torch.bincount(
        (emitted[:, 0] * vocab + emitted[:, 1]) * vocab + emitted[:, 2], minlength=vocab**3
    )
    assert chi_square_p_value(counts, trials * joint) > 1e-3
    assert (
        sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0.05 * trials
    )  # speculation really ran


# ---- config ----------------------------------------------------------------------------------------------------

# Every field of the DeepSeek config classes: read by ModelConfig or DeepseekConfig (setting another value
# changes one of them), irrelevant to inference, or refused.
IRRELEVANT = COMMON_IRRELEVANT | {
    "pretraining_tp",
    "output_router_logits",  # returning router logits (training's auxiliary loss)
    "head_dim",
    "qk_head_dim",  # derived: DeepseekV2/V3Config.__post_init__ set them from the rope / qk dims
}
V2_GROUPED = {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 2}
# field -> (another value, or a dict of fields changed together; other changes that let the field matter,
# or a function of the architecture giving them): the loaded configs must then differ.
IMPLEMENTED = {
    # which version parses the rest (each refuses the other's routing values: checked below, not in the walk)
    "architectures": (None, {}),
    "vocab_size": (100, {}),
    "hidden_size": (2048, {}),
    "intermediate_size": (100, {}),
    "num_hidden_layers": (4, {}),
    "num_attention_heads": ({"num_attention_heads": 16, "num_key_value_heads": 16}, {}),
    "hidden_act": ("gelu", {}),
    "max_position_embeddings": (1024, {}),
    "rms_norm_eps": (1e-5, {}),
    "tie_word_embeddings": (True, {}),
    "rope_parameters": ({"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}, {}),
    "eos_token_id": (7, {}),
    "dtype": ("bfloat16", {}),
    "attention_bias": (True, {}),
    "mlp_bias": (True, {}),
    "kv_lora_rank": (256, {}),
    "q_lora_rank": (None, {}),
    "qk_nope_head_dim": (64, {}),
    "qk_rope_head_dim": (32, {}),
    "v_head_dim": (64, {}),
    "n_routed_experts": (128, {"n_group": 8}),
    "num_experts_per_tok": (4, {}),
    "moe_intermediate_size": (100, {}),
    "n_shared_experts": (3, {}),
    "first_k_dense_replace": (5, {}),
    "routed_scaling_factor": (1.25, {}),
    "rope_interleave": (False, {}),
    "n_group": (4, lambda arch: {} if "V3" in arch else V2_GROUPED),
    "topk_group": (3, lambda arch: {} if "V3" in arch else V2_GROUPED),
    "topk_method": ("group_limited_greedy", {"n_group": 8, "topk_group": 3}),
    "norm_topk_prob": (False, {}),  # V3 (V2 refuses true)
    "num_nextn_predict_layers": (2, {}),
    "num_key_value_heads": (None, {}),  # refused unless equal to num_attention_heads (below)
}
ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


def deepseek_dict(arch: str) -> dict:
    cls = getattr(transformers, arch.replace("ForCausalLM", "Config"))
    cfg = cls().to_dict()
    cfg.update(architectures=[arch], num_key_value_heads=cfg["num_attention_heads"])
    if arch == "DeepseekV2ForCausalLM":
        cfg.update(
            num_experts_per_tok=6
        )  # DeepseekV2Config's default is None, which its router cannot take
    return cfg


def loaded(cfg: dict) -> tuple:
    """What a DeepSeek model computes from ``cfg``: its DeepseekConfig and the ModelConfig fields the engine
    reads (other ModelConfig fields, e.g. head_dim, are the Llama family's)."""
    m = ModelConfig.from_dict(cfg)
    engine = (
        m.vocab_size,
        m.max_position_embeddings,
        m.eos_token_ids,
        m.torch_dtype,
        m.num_hidden_layers,
        m.hidden_size,
        m.num_nextn_predict_layers,
    )
    return engine, DeepseekConfig.from_model_config(m)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_deepseek_field_is_implemented_irrelevant_or_refused(arch):
    base = deepseek_dict(arch)
    unknown = sorted(set(base) - set(IMPLEMENTED) - IRRELEVANT)
    assert not unknown, f"{arch} fields nobody decided on: {unknown}"
    for name in set(base) & set(IMPLEMENTED) - {
        "architectures",
        "num_key_value_heads",
        "norm_topk_prob" if "V2" in arch else "",
    }:
        value, context = IMPLEMENTED[name]
        value = value(arch) if callable(value) else value
        context = context(arch) if callable(context) else context
        changes = value if isinstance(value, dict) else {name: value}
        assert loaded({**base, **context, **changes}) != loaded({**base, **context}), (
            f"{arch}.{name}={value!r}"
        )
    for name in set(base) & IRRELEVANT:
        changed = {**base, name: "changed" if base[name] is None else not base[name]}
        assert loaded(changed) == loaded(base), name


def refused(cfg: dict, *names: str) -> None:
    with pytest.raises(ConfigError) as err:
        loaded(cfg)
    assert all(n in str(err.value) for n in names), str(err.value)


@pytest.mark.parametrize("arch", ARCHS)
def test_unimplemented_deepseek_values_are_refused_by_name(arch):
    base, v3 = deepseek_dict(arch), "V3" in arch
    refused({**base, "num_key_value_heads": 1}, "num_key_value_heads")
    refused(
        {**base, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}},
        "quantization_config",
        "fp8",
    )
    refused({**base, "scoring_func": "softmax" if v3 else "sigmoid"}, "scoring_func")
    refused({**base, "topk_method": "greedy" if v3 else "noaux_tc"}, "topk_method")
    refused({**base, "moe_layer_freq": 0}, "moe_layer_freq", "0")
    # (yarn without original_max_position_embeddings reads it as max_position_embeddings, as transformers'
    # standardize_rope_params fills it in: tests/models/test_rope_config_checks.py)
    refused(
        {**base, "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "factor": 4.0}},
        "longrope",
    )
    refused(
        {
            **base,
            "n_group": 3,
            "topk_group": 1,
            "topk_method": "noaux_tc" if v3 else "group_limited_greedy",
        },
        "n_group",
        "3",
    )
    if not v3:
        refused({**base, "norm_topk_prob": True}, "norm_topk_prob", "True")
    # DeepSeek's own config.json spellings load as they are
    legacy = {
        **base,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "scoring_func": "sigmoid" if v3 else "softmax",
        "topk_method": "noaux_tc" if v3 else "greedy",
        "moe_layer_freq": 1,
    }
    del legacy["rope_parameters"]
    assert loaded(legacy)[1].rope_scaling["factor"] == 40


def test_moe_layer_freq_and_first_dense_layers():
    cfg = {
        **deepseek_dict("DeepseekV3ForCausalLM"),
        "num_hidden_layers": 8,
        "first_k_dense_replace": 3,
        "moe_layer_freq": 2,
    }
    ds = loaded(cfg)[1]
    assert [i for i in range(10) if ds.is_moe_layer(i)] == [4, 6, 8]
    assert not loaded({**cfg, "n_routed_experts": None})[1].is_moe_layer(8)


@pytest.mark.parametrize("arch", ARCHS)
def test_omitted_fields_mean_the_transformers_defaults(arch):
    full = deepseek_dict(arch)
    keep = (
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
        "rms_norm_eps",
        "hidden_act",
        "rope_parameters",
    )
    minimal = {k: full[k] for k in keep}
    if arch == "DeepseekV2ForCausalLM":
        minimal["num_experts_per_tok"] = full[
            "num_experts_per_tok"
        ]  # (the default, None, is refused)
    assert loaded(minimal)[1] == loaded(full)[1]
