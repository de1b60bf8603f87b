"""Step-3.5-Flash (models/step3p5.py) on tiny random checkpoints written under the public Step-3.5 tensor names
(fp32, CPU). transformers has no Step3p5 class, so each part is checked against the transformers component that
computes the same thing, and the whole model against a reference assembled from those components:
- gated attention: Qwen3-Next's attention (zero-centred q/k norms, partial RoPE, sigmoid output gate; its gate
  is per element, Step's per head: the reference's gate rows repeat each head's g_proj row head_dim times),
  with Mistral's sliding-window mask on the sliding layers and Qwen3-Next's RoPE (llama3 scaling over the
  rotated dimensions only) on the full ones;
- MoE: DeepSeek-V3's (sigmoid scores, selection-only bias, renormalised, scaled, one shared expert);
- SwiGLU clamps, the MTP layers and the routed experts with a clamp: small computations written here from
  vLLM's semantics (SwigluStepAndMul, step3p5_mtp.py).
Then the engine: prefill logits, 32 greedy tokens whole and chunked, MTP with 3 chained layers lossless, the
unchained form proposing differently, and the config field walk."""

import pytest
import torch
import transformers
from torch import nn
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE, DeepseekV3TopkRouter
from transformers.models.qwen3_next.modeling_qwen3_next import (
    Qwen3NextAttention,
    Qwen3NextRMSNorm,
    Qwen3NextRotaryEmbedding,
)

import outpace.speculative.drafters.mtp as mtp_proposer
from helpers.step3p5_checkpoints import (
    CONFIG,
    FULL,
    MTP,
    TYPES,
    N,
    layer_shape,
    moe_layers,
    write_checkpoint,
)
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.model_config import ModelConfig
from outpace.models.loader import load_model
from outpace.models.step3p5 import Step3p5MLP, Step3p5MoE, clamped_swiglu
from outpace.models.step3p5_config import Step3p5Config
from outpace.validation import ConfigError

# ---- the reference, assembled from transformers components -------------------------------------------------


def zero_centred_norm(weight: torch.Tensor, eps: float) -> Qwen3NextRMSNorm:
    norm = Qwen3NextRMSNorm(weight.shape[0], eps)  # scales by 1 + weight, as GemmaRMSNorm
    norm.weight.data.copy_(weight)
    return norm


def ref_swiglu(x, gate, up, down, limit):
    """vLLM SwigluStepAndMul (limit) or plain SiLU-gated MLP, written out: x [n, in] -> [n, out]."""
    g, u = x @ gate.T, x @ up.T
    act = torch.nn.functional.silu(g)
    if limit:
        act, u = act.clamp(max=limit), u.clamp(-limit, limit)
    return (act * u) @ down.T


class RefLayer(nn.Module):
    """A Step-3.5 decoder layer from transformers parts: Qwen3-Next's gated attention (and its RoPE), Mistral's
    sliding-window mask, DeepSeek-V3's sigmoid router; the clamped SwiGLU experts written out."""

    def __init__(self, t: dict, cfg: dict, i: int) -> None:
        super().__init__()
        p, eps, d = f"model.layers.{i}.", cfg["rms_norm_eps"], cfg["head_dim"]
        heads, kv = layer_shape(cfg, i)
        self.t, self.p, self.i, self.cfg = t, p, i, cfg
        self.sliding = cfg["layer_types"][i] == "sliding_attention"
        rope = {
            "rope_type": "default",
            "rope_theta": cfg["rope_theta"][i],
            "partial_rotary_factor": cfg["partial_rotary_factors"][i],
        }
        if cfg["layer_types"][i] in cfg["yarn_only_types"]:
            rope.update(cfg["rope_scaling"])
        qcfg = transformers.Qwen3NextConfig(
            hidden_size=cfg["hidden_size"],
            num_attention_heads=heads,
            num_key_value_heads=kv,
            head_dim=d,
            rms_norm_eps=eps,
            max_position_embeddings=cfg["max_position_embeddings"],
            rope_parameters=rope,
        )
        qcfg._attn_implementation = "eager"
        self.attn, self.rotary = Qwen3NextAttention(qcfg, 0).eval(), Qwen3NextRotaryEmbedding(qcfg)
        gate = t[p + "self_attn.g_proj.weight"][:, None, :].expand(
            heads, d, -1
        )  # one gate per head, per element
        q = t[p + "self_attn.q_proj.weight"].view(heads, d, -1)
        self.attn.q_proj.weight.data.copy_(torch.cat((q, gate), dim=1).reshape(heads * 2 * d, -1))
        for name in ("k_proj", "v_proj", "o_proj", "q_norm", "k_norm"):
            getattr(self.attn, name).weight.data.copy_(t[p + f"self_attn.{name}.weight"])
        self.input_norm = zero_centred_norm(t[p + "input_layernorm.weight"], eps)
        self.post_norm = zero_centred_norm(t[p + "post_attention_layernorm.weight"], eps)
        self.moe = i in moe_layers(cfg)
        if self.moe:
            dcfg = transformers.DeepseekV3Config(
                hidden_size=cfg["hidden_size"],
                n_routed_experts=cfg["moe_num_experts"],
                num_experts_per_tok=cfg["moe_top_k"],
                n_group=1,
                topk_group=1,
                norm_topk_prob=True,
                routed_scaling_factor=cfg["moe_router_scaling_factor"],
            )
            self.router = DeepseekV3TopkRouter(dcfg)
            self.router.weight.data.copy_(t[p + "moe.gate.weight"])
            self.router.e_score_correction_bias.copy_(t[p + "moe.router_bias"])
        mask_cfg = transformers.MistralConfig(
            sliding_window=cfg["sliding_window"] if self.sliding else None
        )
        mask_cfg._attn_implementation = "eager"
        self.mask_cfg = mask_cfg

    def ffn(self, x: torch.Tensor) -> torch.Tensor:
        t, p, i = self.t, self.p, self.i
        shared_limit, limit = self.cfg["swiglu_limits_shared"][i], self.cfg["swiglu_limits"][i]
        if not self.moe:
            return ref_swiglu(
                x,
                t[p + "mlp.gate_proj.weight"],
                t[p + "mlp.up_proj.weight"],
                t[p + "mlp.down_proj.weight"],
                shared_limit,
            )
        _, weights, ids = self.router(x)
        out = ref_swiglu(
            x,
            t[p + "share_expert.gate_proj.weight"],
            t[p + "share_expert.up_proj.weight"],
            t[p + "share_expert.down_proj.weight"],
            shared_limit,
        )
        for row in range(x.shape[0]):
            for j in range(ids.shape[1]):
                e = ids[row, j]
                out[row] += (
                    weights[row, j]
                    * ref_swiglu(
                        x[row : row + 1],
                        t[p + "moe.gate_proj.weight"][e],
                        t[p + "moe.up_proj.weight"][e],
                        t[p + "moe.down_proj.weight"][e],
                        limit,
                    )[0]
                )
        return out

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """x [L, hidden] (positions 0 .. L - 1) -> [L, hidden]."""
        x, pos = x[None], torch.arange(x.shape[0])[None]
        make_mask = create_sliding_window_causal_mask if self.sliding else create_causal_mask
        mask = make_mask(
            config=self.mask_cfg, inputs_embeds=x, attention_mask=None, cache=None, position_ids=pos
        )
        return self.attn(x, self.rotary(x, pos), mask)[0][0]

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = h + self.attention(self.input_norm(h))
        return h + self.ffn(self.post_norm(h))


class Reference(nn.Module):
    """The whole model (and its MTP layers), recomputed from scratch on every call."""

    def __init__(self, t: dict, cfg: dict) -> None:
        super().__init__()
        eps, n = cfg["rms_norm_eps"], cfg["num_hidden_layers"]
        self.t, self.n = t, n
        self.layers = nn.ModuleList(
            RefLayer(t, cfg, i) for i in range(n + cfg["num_nextn_predict_layers"])
        )
        self.norm = zero_centred_norm(t["model.norm.weight"], eps)
        self.mtp_norms = [
            (
                zero_centred_norm(t[f"model.layers.{i}.enorm.weight"], eps),
                zero_centred_norm(t[f"model.layers.{i}.hnorm.weight"], eps),
                zero_centred_norm(t[f"model.layers.{i}.transformer.shared_head.norm.weight"], eps),
            )
            for i in range(n, len(self.layers))
        ]

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [L] -> (pre-norm hidden [L, hidden], logits [L, vocab])."""
        h = self.t["model.embed_tokens.weight"][ids]
        for layer in self.layers[: self.n]:
            h = layer(h)
        return h, self.norm(h) @ self.t["lm_head.weight"].T

    def mtp(self, ids: torch.Tensor, hidden: torch.Tensor) -> list[torch.Tensor]:
        """vLLM step3p5_mtp.py, chained: layer k's row t reads token t + k + 1 and layer k - 1's output at t
        (layer 0: the target's pre-norm state) -> each layer's logits [L - 1 - k, vocab]."""
        out, prev = [], hidden[:-1]
        for k, (enorm, hnorm, head_norm) in enumerate(self.mtp_norms):
            i, m = self.n + k, ids.shape[0] - 1 - k
            embeds = self.t["model.embed_tokens.weight"][ids[k + 1 : k + 1 + m]]
            h = (
                torch.cat((enorm(embeds), hnorm(prev[:m])), dim=-1)
                @ self.t[f"model.layers.{i}.eh_proj.weight"].T
            )
            prev = self.layers[i](h)
            out.append(
                head_norm(prev)
                @ self.t[f"model.layers.{i}.transformer.shared_head.output.weight"].T
            )
        return out

    def greedy(self, prompt: list[int], steps: int) -> list[int]:
        seq = list(prompt)
        for _ in range(steps):
            seq.append(int(self(torch.tensor(seq))[1][-1].argmax()))
        return seq[len(prompt) :]


# ---- fixtures ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """-> (outpace model, reference, checkpoint directory)."""
    path, tensors = write_checkpoint(tmp_path_factory.mktemp("step3p5"), CONFIG)
    return load_model(path, torch.float32), Reference(tensors, CONFIG).eval(), path


def rel_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def paged(fn, n: int, blocks=(5, 2, 7, 0, 3, 1), block_size: int = 16):
    """Run fn() inside a prefill forward context of n tokens at positions 0 .. n - 1."""
    with forward_context(build_paged_metadata([list(blocks)], [0], [n], block_size, "cpu")):
        return fn()


IDS = torch.randint(0, 61, (40,), generator=torch.Generator().manual_seed(1))


# ---- parts ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layer", [0, 1]
)  # full attention (llama3-scaled partial RoPE), sliding (window 5)
def test_gated_attention_matches_qwen3_next(layer, target):
    model, ref, _ = target
    x = torch.randn(40, CONFIG["hidden_size"], generator=torch.Generator().manual_seed(2))
    attn = model.model.layers[layer].self_attn
    assert (attn.attn.sliding_window is None) == FULL[layer] and attn.attn.num_heads == layer_shape(
        CONFIG, layer
    )[0]
    with torch.no_grad():
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        ours = paged(lambda: attn(torch.arange(40), x), 40)
        expected = ref.layers[layer].attention(x)
    assert rel_error(ours, expected) < 1e-5
    # the window matters: the sliding layer without it (a causal mask) computes something else
    with torch.no_grad():
        ref.layers[layer].sliding = False
        unwindowed = ref.layers[layer].attention(x)
        ref.layers[layer].sliding = not FULL[layer]
    assert (rel_error(unwindowed, expected) > 1e-3) == (not FULL[layer])


def test_moe_matches_deepseek_v3():
    """Step's router, stacked experts and shared expert against DeepseekV3MoE with one group, renormalised
    and scaled weights, one shared expert of the routed experts' width; 7 experts, top 3."""
    cfg = ModelConfig.from_dict({**CONFIG, "share_expert_dim": CONFIG["moe_intermediate_size"]})
    step = Step3p5Config.from_model_config(cfg)
    ds = DeepseekV3MoE(
        transformers.DeepseekV3Config(
            hidden_size=40,
            moe_intermediate_size=20,
            n_routed_experts=7,
            num_experts_per_tok=3,
            n_group=1,
            topk_group=1,
            n_shared_experts=1,
            norm_topk_prob=True,
            routed_scaling_factor=3.0,
        )
    ).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in list(ds.parameters()) + list(ds.buffers()):
            p.copy_(0.3 * torch.randn_like(p))
        moe, shared = Step3p5MoE(step, limit=None), Step3p5MLP(40, 20, limit=None)
        inter = step.moe_intermediate_size
        moe.gate.weight.copy_(ds.gate.weight)
        moe.gate.e_score_correction_bias.copy_(ds.gate.e_score_correction_bias)
        moe.gate_proj.weight.copy_(ds.experts.gate_up_proj[:, :inter])
        moe.up_proj.weight.copy_(ds.experts.gate_up_proj[:, inter:])
        moe.down_proj.weight.copy_(ds.experts.down_proj)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(shared, name).weight.copy_(getattr(ds.shared_experts, name).weight)
        x = torch.randn(33, 40)
        expected = ds(x[None])[0]
        ours = moe(x) + shared(x)
        # the correction bias chooses experts: without it some tokens route elsewhere
        moe.gate.e_score_correction_bias.zero_()
        unbiased = moe(x) + shared(x)
    assert rel_error(ours, expected) < 1e-5
    assert rel_error(unbiased, expected) > 1e-3


def test_swiglu_clamp_is_vllms_swiglustep():
    g, u = torch.linspace(-6, 6, 97), torch.linspace(5, -5, 97)
    expected = torch.nn.functional.silu(g).clamp(max=0.7) * u.clamp(
        -0.7, 0.7
    )  # vLLM SwigluStepAndMul, limit 0.7
    torch.testing.assert_close(clamped_swiglu(g, u, 0.7), expected, rtol=0, atol=0)
    assert not torch.equal(clamped_swiglu(g, u, None), expected)


def test_layers_read_their_config_lists(target):
    """Per layer: window, heads, rotated dims, theta, scaling only on full layers, MoE or dense, clamps."""
    model, _, _ = target
    specs = model.step_config.layers
    assert len(specs) == N + MTP
    for i, spec in enumerate(specs):
        assert (spec.sliding_window, spec.num_heads) == ((None, 4) if FULL[i] else (5, 6))
        assert (
            spec.rotary_dim == (6 if FULL[i] else 12) and spec.rope_theta == CONFIG["rope_theta"][i]
        )
        assert (spec.rope_scaling is not None) == FULL[i] and spec.moe == (i in (1, 2, 4))
        assert spec.swiglu_limit == (CONFIG["swiglu_limits"][i] or None)
        assert spec.swiglu_limit_shared == (CONFIG["swiglu_limits_shared"][i] or None)
    # MTP layer k is decoder layer N + k of the lists: layer 4 is MoE and slides, 5 is dense and full
    assert model.mtp_layers[0].is_moe and type(model.mtp_layers[0].moe).__name__ == "Step3p5MoE"
    assert model.mtp_layers[0].self_attn.attn.sliding_window == 5
    assert (
        not model.mtp_layers[1].is_moe and model.mtp_layers[1].self_attn.attn.sliding_window is None
    )
    assert len(model.model.rotaries) == 2  # one table per (rotated dims, theta, scaling) in use


# ---- whole model ---------------------------------------------------------------------------------------------


def test_prefill_logits_match_the_reference(target):
    model, ref, _ = target
    with torch.no_grad():
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        ours = paged(lambda: model.compute_logits(model(IDS, torch.arange(40)).hidden_states), 40)
        expected = ref(IDS)[1]
    assert rel_error(ours, expected) < 1e-5


PROMPTS = [[3, 17, 59, 40, 8, 42, 7], list(range(20, 39)), [(i * 37) % 61 for i in range(13)]]
GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_greedy_tokens_match_the_reference_whole_and_chunked(target):
    """Prefill then 32 greedy tokens through the engine (batched; prompts and generations cross the window)
    equal the reference recomputed from scratch per token; chunked prefill (8 tokens a forward) equals whole."""
    _, ref, path = target
    with torch.no_grad():
        expected = [ref.greedy(p, 32) for p in PROMPTS]
    for chunk in (2048, 8):
        outs = LLM(
            str(path), block_size=4, num_kv_blocks=128, max_num_batched_tokens=chunk
        ).generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == expected, f"chunks of {chunk}"


def test_mtp_layers_match_the_reference_chained(target):
    model, ref, _ = target
    n = IDS.shape[0]
    with torch.no_grad():
        hidden, _ = ref(IDS)
        expected = ref.mtp(IDS, hidden)
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        bind_kv_cache(model.mtp_layers, BlockPool(8, 16), torch.float32, "cpu")
        ours_hidden = paged(lambda: model(IDS, torch.arange(n)).hidden_states, n)
        prev = model.mtp_layers[0].target_state(model, ours_hidden[:-1])
        for k, layer in enumerate(model.mtp_layers):
            m = n - 1 - k
            prev = paged(
                lambda: layer(torch.arange(m), IDS[k + 1 : k + 1 + m], prev[:m], model),
                m,
            )
            assert rel_error(layer.compute_logits(model, prev), expected[k]) < 1e-5, k


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    """A small vocabulary, so random MTP layers' drafts are accepted now and then."""
    path, _ = write_checkpoint(
        tmp_path_factory.mktemp("step3p5-mtp"), {**CONFIG, "vocab_size": 13}, seed=4
    )
    return path


MTP_PROMPTS = [[1, 5, 2, 7, 3], [4, 4, 8, 1, 9, 12, 0, 3, 5, 6, 2], list(range(13)) * 2]


def run_recording_drafts(path, monkeypatch, chained: bool):
    """Greedy outputs with 3 chained MTP layers (or, unchained, every layer fed the target's state), the drafts
    of each draft step, and the number of accepted drafts."""
    drafts, real = [], mtp_proposer.chain_drafts
    monkeypatch.setattr(
        mtp_proposer,
        "chain_drafts",
        lambda rows, tokens, probs: (
            drafts.append(torch.stack(tokens, 1).clone()),
            real(rows, tokens, probs),
        )[1],
    )
    init = mtp_proposer.MTPProposer.__init__

    def with_form(self, *args, **kwargs):
        init(self, *args, **kwargs)
        assert self.chained  # Step-3.5's layout chains
        self.chained = chained

    monkeypatch.setattr(mtp_proposer.MTPProposer, "__init__", with_form)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=64,
        speculative=SpeculativeConfig("mtp", num_steps=3),
    )
    outs = llm.generate(MTP_PROMPTS, GREEDY.replace(max_tokens=24))
    assert llm.engine.pool.num_free == 64
    return (
        [o.token_ids for o in outs],
        drafts,
        sum(o.spec_metrics.num_accepted_drafts for o in outs),
    )


def test_mtp_chained_is_lossless_and_differs_from_unchained(mtp_target, monkeypatch):
    plain = [
        o.token_ids
        for o in LLM(str(mtp_target), block_size=4).generate(
            MTP_PROMPTS, GREEDY.replace(max_tokens=24)
        )
    ]
    chained, chained_drafts, accepted = run_recording_drafts(mtp_target, monkeypatch, chained=True)
    assert chained == plain and accepted > 0, "lossless, and some draft accepted"
    unchained, unchained_drafts, _ = run_recording_drafts(mtp_target, monkeypatch, chained=False)
    assert unchained == plain
    # The first draft step sees the same state in both runs: layer 0 proposes the same token, the later layers
    # (chained: fed layer k - 1's output; unchained: the target's state) propose different ones.
    first_chained, first_unchained = chained_drafts[0], unchained_drafts[0]  # [rows, 3]
    assert torch.equal(first_chained[:, 0], first_unchained[:, 0])
    assert not torch.equal(first_chained[:, 1:], first_unchained[:, 1:])


# ---- config ------------------------------------------------------------------------------------------------


def loaded(cfg: dict) -> tuple:
    """What a Step3p5 model computes from ``cfg``: the ModelConfig fields the engine reads and Step3p5Config."""
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
    return engine, Step3p5Config.from_model_config(m)


def with_other(**changes) -> dict:
    return {**CONFIG["attention_other_setting"], **changes}


# field -> a config change that must change what is loaded
IMPLEMENTED = {
    "hidden_size": {"hidden_size": 48},
    "intermediate_size": {"intermediate_size": 60},
    "num_hidden_layers": {"num_hidden_layers": 3},
    "num_attention_heads": {"num_attention_heads": 8},
    "num_attention_groups": {"num_attention_groups": 4},
    "head_dim": {"head_dim": 16, "attention_other_setting": with_other(head_dim=16)},
    "vocab_size": {"vocab_size": 67},
    "max_position_embeddings": {"max_position_embeddings": 128},
    "rms_norm_eps": {"rms_norm_eps": 1e-6},
    "layer_types": {"layer_types": ["sliding_attention"] + TYPES[1:]},
    "sliding_window": {"sliding_window": 7},
    "attention_other_setting": {"attention_other_setting": with_other(num_attention_heads=4)},
    "rope_theta": {"rope_theta": [2e4] * (N + MTP)},
    "rope_scaling": {"rope_scaling": {**CONFIG["rope_scaling"], "factor": 4.0}},
    "yarn_only_types": {"yarn_only_types": ["full_attention", "sliding_attention"]},
    "partial_rotary_factors": {"partial_rotary_factors": [1.0] * (N + MTP)},
    "moe_num_experts": {"moe_num_experts": 9},
    "moe_top_k": {"moe_top_k": 2},
    "moe_intermediate_size": {"moe_intermediate_size": 24},
    "share_expert_dim": {"share_expert_dim": 20},
    "moe_layers_enum": {"moe_layers_enum": "1,2"},
    "moe_router_scaling_factor": {"moe_router_scaling_factor": 2.0},
    "use_head_wise_attn_gate": {"use_head_wise_attn_gate": False},
    "swiglu_limits": {"swiglu_limits": [0.0] * (N + MTP)},
    "swiglu_limits_shared": {"swiglu_limits_shared": [7.0] * (N + MTP)},
    "num_nextn_predict_layers": {"num_nextn_predict_layers": 2},
    "eos_token_id": {"eos_token_id": 7},
    "torch_dtype": {"torch_dtype": "bfloat16"},
    "architectures": None,  # selects this class (the registry's line; test_registry_builds_step3p5 below)
}
# Fields that do not change what inference computes, and why.
IRRELEVANT = {
    "model_type",
    "auto_map",  # which transformers class / remote code file: the architectures entry decides
    "bos_token_id",  # the tokenizer's business
    "max_seq_len",  # vLLM and SGLang size the RoPE tables by max_position_embeddings
    # neither vLLM nor SGLang reads these: moe_layers_enum lists the MoE layers
    "use_moe",
    "moe_layer_offset",
    "moe_every_n_layer",
    "moe_dynamic_exp_p",
}
# Fields implemented at the one value both references build; any other value is refused by name.
REFUSED_OTHERWISE = {
    "use_qk_norm": False,
    "zero_centered": False,
    "sink": True,
    "att_impl_type": "MLA",
    "need_fp32_gate": False,
    "norm_expert_weight": False,
    "use_moe_router_bias": False,
    "moe_router_activation": "softmax",
    "tie_word_embeddings": True,
    "use_rope_layers": [True, False] + [True] * (N + MTP - 2),
}


def refused(cfg: dict, *names: str) -> None:
    with pytest.raises(ConfigError) as err:
        loaded(cfg)
    assert all(n in str(err.value) for n in names), str(err.value)


def test_every_config_field_is_implemented_irrelevant_or_refused():
    unknown = sorted(set(CONFIG) - set(IMPLEMENTED) - IRRELEVANT - set(REFUSED_OTHERWISE))
    assert not unknown, f"Step3p5 fields nobody decided on: {unknown}"
    base = loaded(CONFIG)
    for name, changes in IMPLEMENTED.items():
        if changes is not None:
            assert loaded({**CONFIG, **changes}) != base, f"{name}: {changes} changes nothing"
    for name in IRRELEVANT:
        assert loaded({**CONFIG, name: "changed"}) == base, name
    for name, value in REFUSED_OTHERWISE.items():
        refused({**CONFIG, name: value}, name)


def test_unimplemented_values_are_refused_by_name():
    refused({**CONFIG, "layer_types": TYPES[:N]}, "layer_types")  # the MTP layers need entries too
    refused(
        {**CONFIG, "layer_types": ["chunked_attention"] * (N + MTP)},
        "layer_types",
        "chunked_attention",
    )
    refused({**CONFIG, "sliding_window": 0}, "sliding_window", "0")
    refused(
        {**CONFIG, "yarn_only_types": []}, "yarn_only_types"
    )  # vLLM scales every layer, SGLang none
    refused(
        {**CONFIG, "attention_other_setting": with_other(attention_type="full_attention")},
        "attention_type",
    )
    refused(
        {**CONFIG, "attention_other_setting": with_other(head_dim=16)},
        "attention_other_setting.head_dim",
    )
    refused({**CONFIG, "rope_theta": [1e4] * N}, "rope_theta")
    refused(
        {**CONFIG, "partial_rotary_factors": [0.25] * (N + MTP)}, "partial_rotary_factors"
    )  # 3 dims: odd
    refused({**CONFIG, "swiglu_limits": [-1.0] * (N + MTP)}, "swiglu_limits")
    refused({k: v for k, v in CONFIG.items() if k != "moe_layers_enum"}, "moe_layers_enum")
    # omitted: vLLM's config class means softmax, SGLang sigmoid
    refused(
        {k: v for k, v in CONFIG.items() if k != "moe_router_activation"},
        "moe_router_activation",
        "softmax",
    )
    refused({**CONFIG, "moe_top_k": 8}, "moe_top_k", "8")
    refused({**CONFIG, "scale_emb": 2.0}, "scale_emb")
    refused({**CONFIG, "attention_bias": True}, "attention_bias")
    refused({**CONFIG, "hidden_act": "gelu"}, "hidden_act", "gelu")
    refused(
        {**CONFIG, "quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}},
        "quantization_config",
        "fp8",
    )


def test_registry_builds_step3p5(target):
    model, _, _ = target
    assert type(model).__name__ == "Step3p5ForCausalLM" and len(model.mtp_layers) == MTP
    assert (
        model.config.num_key_value_heads == 2 and model.config.rope_theta == CONFIG["rope_theta"][0]
    )
