"""Published draft formats load and run losslessly: EAGLE3 as ``pytorch_model.bin`` and in vLLM's
speculators format, a draft whose rotary table is shorter than the target's context, a standalone
draft with a differently padded vocabulary, and DeepSeek-V3-style MTP layers with their own
embedding and shared head. Each checkpoint is written here from the format's public config and
tensor names, with random weights."""

import dataclasses
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.spec_models import make_eagle3_draft, random_llama
from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.models.drafts.eagle3 import load_eagle3_draft
from outpace.models.loader import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
PROMPTS = [[(i * 29 + j * 3) % 200 for j in range(4 + 9 * i)] for i in range(3)]


def reference(target, prompts):
    """``--method none`` greedy outputs."""
    return LLM(str(target), block_size=4).generate(prompts, GREEDY)


def record_proposals(llm) -> list[torch.Tensor]:
    """Every Drafts.token_ids [batch, 1 + drafts] the engine's proposer returns, from now on."""
    proposer, seen = llm.engine.proposer, []
    draft = proposer.draft

    def wrapped(rows, shape):
        drafts = draft(rows, shape)
        seen.append(drafts.token_ids.clone())
        return drafts

    proposer.draft = wrapped
    return seen


def assert_lossless(target, draft_dir, method="eagle3", prompts=PROMPTS, **spec_args):
    """Greedy output with the draft equals ``--method none``; returns the LLM and every proposal."""
    expected = reference(target, prompts)
    llm = LLM(
        str(target),
        block_size=4,
        speculative=SpeculativeConfig(method, draft_dir and str(draft_dir), **spec_args),
    )
    seen = record_proposals(llm)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [o.token_ids for o in expected]
    assert seen, "the draft never proposed"
    return llm, seen


def draft_logits(draft, target, prompt: list[int]) -> torch.Tensor:
    """The draft's logits [n, draft_vocab] over a prompt's rows (one draft-extend, dense attention)."""
    n = len(prompt)
    target.set_aux_hidden_state_layers(
        draft.config.capture_layer_ids(target.config.num_hidden_layers)
    )
    ids = torch.tensor(prompt)
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        aux = target(ids, torch.arange(n)).aux_hidden_states
        return draft.compute_logits(
            draft(torch.roll(ids, -1), torch.arange(n), draft.fuse_aux(aux))
        )


# ---- EAGLE3 as pytorch_model.bin (the EAGLE-3 release; SGLang's test draft) --------------------------------


def test_eagle3_bin_checkpoint_loads_like_its_safetensors(llama_dir, tmp_path):
    native = make_eagle3_draft(llama_dir, tmp_path / "st", draft_vocab_size=120)
    tensors = load_file(native / "model.safetensors")
    single = tmp_path / "bin"
    single.mkdir()
    shutil.copy(native / "config.json", single)
    torch.save(
        tensors, single / "pytorch_model.bin"
    )  # names as in the release: midlayer.*, fc, d2t, t2d
    sharded = tmp_path / "bin-sharded"  # transformers' sharded layout: pytorch_model.bin.index.json
    sharded.mkdir()
    shutil.copy(native / "config.json", sharded)
    names = sorted(tensors)
    shards = {
        "pytorch_model-00001-of-00002.bin": names[::2],
        "pytorch_model-00002-of-00002.bin": names[1::2],
    }
    for file, part in shards.items():
        torch.save({n: tensors[n] for n in part}, sharded / file)
    weight_map = {n: file for file, part in shards.items() for n in part}
    (sharded / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )

    target = load_model(llama_dir, torch.float32)
    reference = draft_logits(
        load_eagle3_draft(native, target, torch.float32, "cpu"), target, PROMPTS[2]
    )
    for d in (single, sharded):
        torch.testing.assert_close(
            draft_logits(load_eagle3_draft(d, target, torch.float32, "cpu"), target, PROMPTS[2]),
            reference,
            rtol=0,
            atol=0,
        )
    _, st_proposals = assert_lossless(llama_dir, native, num_steps=3)
    _, bin_proposals = assert_lossless(llama_dir, single, num_steps=3)
    assert all(torch.equal(a, b) for a, b in zip(st_proposals, bin_proposals))


def test_dflash_bin_checkpoint_proposes_like_its_safetensors(tmp_path):
    """The zoo's DFlash draft saved as pytorch_model.bin serves the zoo target exactly as the original."""
    from outpace.zoo import default_draft, default_model

    native = default_draft("dflash")
    as_bin = tmp_path / "dflash-bin"
    as_bin.mkdir()
    shutil.copy(native / "config.json", as_bin)
    torch.save(load_file(native / "model.safetensors"), as_bin / "pytorch_model.bin")
    _, st_proposals = assert_lossless(default_model(), native, method="dflash", num_steps=7)
    _, bin_proposals = assert_lossless(default_model(), as_bin, method="dflash", num_steps=7)
    assert all(torch.equal(a, b) for a, b in zip(st_proposals, bin_proposals))


# ---- EAGLE3 in vLLM's speculators format -----------------------------------------------------------------


def to_speculators(native_dir, out_dir, norm_before_residual=False):
    """The native draft rewritten in the speculators format (speculators Eagle3SpeculatorConfig and
    vLLM's SpeculatorsConfig): layer shapes in transformer_layer_config (a LlamaConfig's to_diff_dict),
    the layer's tensors under layers.0., a verifier_norm copy that loaders skip."""
    from transformers import LlamaConfig

    native = json.loads((native_dir / "config.json").read_text())
    layer_keys = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "max_position_embeddings",
        "rope_theta",
    )
    layer = LlamaConfig(num_hidden_layers=1, **{k: native[k] for k in layer_keys}).to_diff_dict()
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": native["draft_vocab_size"],
        "target_hidden_size": None,
        "norm_before_residual": norm_before_residual,
        "eagle_aux_hidden_state_layer_ids": None,
        "torch_dtype": "float32",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": 3,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": "target", "architectures": ["LlamaForCausalLM"]},
        },
    }
    tensors = {
        n.replace("midlayer.", "layers.0."): t
        for n, t in load_file(native_dir / "model.safetensors").items()
    }
    tensors["verifier_norm.weight"] = torch.ones(native["hidden_size"])
    out_dir.mkdir()
    save_file(tensors, out_dir / "model.safetensors")
    (out_dir / "config.json").write_text(json.dumps(cfg))
    return out_dir


def eagle3_layer_reference(
    draft, embed: torch.Tensor, g: torch.Tensor, norm_before_residual: bool
) -> torch.Tensor:
    """One row at position 0 through speculators' Eagle3DecoderLayer, by hand: attention over a single
    key is its value, so no rotary is needed. embed, g [1, hidden] -> [1, hidden] pre-norm output."""
    w = {n: p.detach() for n, p in draft.midlayer.named_parameters()}
    cfg = draft.config.layer

    def rms(x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    normed = rms(g, w["hidden_norm.weight"])
    x = torch.cat((rms(embed, w["input_layernorm.weight"]), normed), dim=-1)
    residual = normed if norm_before_residual else g
    v = (x @ w["self_attn.v_proj.weight"].T).view(cfg.num_key_value_heads, cfg.head_dim)
    v = v.repeat_interleave(cfg.num_attention_heads // cfg.num_key_value_heads, 0).reshape(1, -1)
    h = residual + v @ w["self_attn.o_proj.weight"].T
    m = rms(h, w["post_attention_layernorm.weight"])
    gate, up = m @ w["mlp.gate_proj.weight"].T, m @ w["mlp.up_proj.weight"].T
    return h + (torch.nn.functional.silu(gate) * up) @ w["mlp.down_proj.weight"].T


def test_speculators_eagle3_equals_the_native_format(llama_dir, tmp_path):
    native = make_eagle3_draft(llama_dir, tmp_path / "native", draft_vocab_size=120)
    spec = to_speculators(native, tmp_path / "speculators")
    target = load_model(llama_dir, torch.float32)
    a = load_eagle3_draft(native, target, torch.float32, "cpu")
    b = load_eagle3_draft(spec, target, torch.float32, "cpu")
    eos = a.config.layer.eos_token_ids  # (a token-id default of LlamaConfig, unused by drafts)
    assert (
        dataclasses.replace(b.config, layer=dataclasses.replace(b.config.layer, eos_token_ids=eos))
        == a.config
    )
    torch.testing.assert_close(
        draft_logits(b, target, PROMPTS[2]), draft_logits(a, target, PROMPTS[2]), rtol=0, atol=0
    )
    _, native_proposals = assert_lossless(llama_dir, native, num_steps=3)
    _, spec_proposals = assert_lossless(llama_dir, spec, num_steps=3)
    assert all(torch.equal(x, y) for x, y in zip(native_proposals, spec_proposals))


def test_speculators_norm_before_residual_follows_the_format(llama_dir, tmp_path):
    native = make_eagle3_draft(llama_dir, tmp_path / "native", draft_vocab_size=120)
    spec = to_speculators(native, tmp_path / "speculators", norm_before_residual=True)
    target = load_model(llama_dir, torch.float32)
    outputs = {}
    for flag, path in ((False, native), (True, spec)):
        draft = load_eagle3_draft(path, target, torch.float32, "cpu")
        assert draft.config.norm_before_residual is flag
        embed, g = (
            draft.embed(torch.tensor([7])),
            torch.randn(1, 48, generator=torch.Generator().manual_seed(1)),
        )
        with torch.no_grad(), forward_context(DenseCausalMetadata(1, 1)):
            outputs[flag] = draft(torch.tensor([7]), torch.tensor([0]), g)
            torch.testing.assert_close(outputs[flag], eagle3_layer_reference(draft, embed, g, flag))
    assert not torch.allclose(outputs[False], outputs[True], atol=1e-3)  # the flag matters
    assert_lossless(llama_dir, spec, num_steps=3)


# ---- a draft whose rotary table is shorter than the target's context -------------------------------------


def test_short_rotary_draft_runs_past_its_max_position_embeddings(llama_dir, tmp_path):
    """The EAGLE-3 release says max_position_embeddings 2048 for 128k-context targets; here 16 for 512."""
    draft = make_eagle3_draft(
        llama_dir, tmp_path / "d", draft_vocab_size=150, max_position_embeddings=16
    )
    prompts = [[(j * 7) % 200 for j in range(30)], [3, 5, 8]]
    llm, _ = assert_lossless(llama_dir, draft, prompts=prompts, num_steps=3)
    assert llm.engine.proposer.draft_model.rotary.cos.shape[0] >= 512  # the target's context


# ---- a standalone draft with a differently padded vocabulary ---------------------------------------------


def copy_tokenizer(src, dst):
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, dst)


def test_padded_vocab_draft_never_proposes_padding(zoo_like_dir, tmp_path):
    """Like Qwen2.5-7B (152064 rows) with Qwen2.5-0.5B (151936 rows) over one 151665-token tokenizer:
    here target 410 and draft 424 rows over 400 tokens, the draft's padding rows made its favourites.
    The draft also says max_position_embeddings 16, shorter than the target's 512."""
    real = json.loads((zoo_like_dir / "config.json").read_text())["vocab_size"]
    target = save_hf_model(
        make_hf_model("llama", vocab_size=real + 10, eos_token_id=0), tmp_path / "target"
    )
    draft = random_llama(tmp_path / "draft", real + 24, seed=4, std=0.2)
    cfg = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 16}))
    tensors = load_file(draft / "model.safetensors")
    tensors["lm_head.weight"][real:] = (
        tensors["lm_head.weight"][:real].abs().max() * 50
    )  # [pad, hidden]
    save_file(tensors, draft / "model.safetensors")
    for d in (target, draft):
        copy_tokenizer(zoo_like_dir, d)
    prompts = [[(i * 37 + j * 11) % real for j in range(12 + 9 * i)] for i in range(3)]
    _, seen = assert_lossless(target, draft, method="draft", prompts=prompts, num_steps=3)
    drafted = torch.cat([s[:, 1:].reshape(-1) for s in seen])
    assert drafted.numel() > 0 and int(drafted.max()) < real


def test_target_padding_ids_past_the_draft_embedding_do_not_crash(zoo_like_dir, tmp_path):
    """The other way round: the target's embedding (420 rows) is padded past the draft's (404), and the
    target's head favours its padding ids, so it emits ids the draft's embedding lacks."""
    real = json.loads((zoo_like_dir / "config.json").read_text())["vocab_size"]
    target = save_hf_model(
        make_hf_model("llama", vocab_size=real + 20, eos_token_id=0), tmp_path / "target"
    )
    tensors = load_file(target / "model.safetensors")
    tensors["lm_head.weight"][real + 10 :] = (
        tensors["lm_head.weight"][:real].abs().max() * 50
    )  # [pad, hidden]
    save_file(tensors, target / "model.safetensors")
    draft = random_llama(tmp_path / "draft", real + 4, seed=5)
    for d in (target, draft):
        copy_tokenizer(zoo_like_dir, d)
    llm, _ = assert_lossless(target, draft, method="draft", num_steps=3)
    emitted = [t for o in llm.generate(PROMPTS, GREEDY) for t in o.token_ids]
    assert max(emitted) >= real + 4  # the draft did read ids past its embedding


def test_padded_vocab_draft_with_another_tokenizer_is_refused(zoo_like_dir, tmp_path):
    from outpace.validation import ConfigError

    real = json.loads((zoo_like_dir / "config.json").read_text())["vocab_size"]
    target = save_hf_model(make_hf_model("llama", vocab_size=real + 10), tmp_path / "target")
    draft = random_llama(tmp_path / "draft", real + 24, seed=4)
    for d in (target, draft):
        copy_tokenizer(zoo_like_dir, d)
    tok = json.loads((draft / "tokenizer.json").read_text())
    tok["added_tokens"][0]["id"] = real + 5  # one special token moved into the padding
    (draft / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(
        ConfigError, match=rf"tokenizer\.json: .* field 'added_tokens' gives .* id {real + 5}, "
    ):
        LLM(str(target), speculative=SpeculativeConfig("draft", str(draft)))


# ---- DeepSeek-V3-style MTP layers: own embed_tokens and shared_head --------------------------------------


@pytest.fixture(scope="module")
def deepseek_mtp_target(tmp_path_factory):
    """A Llama target with one MTP layer stored as DeepSeek-V3 stores model.layers.61: enorm, hnorm,
    eh_proj, the decoder block, and its own embed_tokens and shared_head.{norm,head} (config: only
    num_nextn_predict_layers, as DeepSeek-V3's)."""
    path = random_llama(tmp_path_factory.mktemp("dsmtp"), 300, seed=5, mtp_layers=1, std=0.3)
    cfg = json.loads((path / "config.json").read_text())
    cfg.pop("chain_mtp_hidden_states")
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(path / "model.safetensors")
    g = torch.Generator().manual_seed(6)
    mtp = f"model.layers.{cfg['num_hidden_layers']}"
    tensors[f"{mtp}.embed_tokens.weight"] = torch.randn(300, 32, generator=g) * 0.4
    tensors[f"{mtp}.shared_head.norm.weight"] = 1 + 0.2 * torch.randn(32, generator=g)
    tensors[f"{mtp}.shared_head.head.weight"] = torch.randn(300, 32, generator=g) * 0.4
    # a non-uniform final norm: the MTP layer's input differs pre- and post-norm even after its hnorm
    tensors["model.norm.weight"] = 1 + 0.5 * torch.randn(32, generator=g)
    save_file(tensors, path / "model.safetensors")
    return path


def mtp_reference_logits(path, prompt: list[int], next_token: int) -> torch.Tensor:
    """One MTP step by hand from the public semantics (vLLM deepseek_mtp.py, DeepSeek-V3 report):
    row t reads token t+1 (embedding from the MTP layer's own embed_tokens, zeroed at position 0)
    and the target's hidden state at t after its final norm; eh_proj([enorm(e), hnorm(h)]); the
    decoder block (transformers' LlamaDecoderLayer as the reference); then shared_head.norm and
    shared_head.head. Returns [n, vocab] logits."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.models.llama.modeling_llama import (
        LlamaDecoderLayer,
        LlamaRMSNorm,
        LlamaRotaryEmbedding,
    )

    cfg_dict = json.loads((path / "config.json").read_text())
    L = cfg_dict["num_hidden_layers"]
    w = load_file(path / "model.safetensors")
    mtp = {
        n.removeprefix(f"model.layers.{L}."): t
        for n, t in w.items()
        if n.startswith(f"model.layers.{L}.")
    }
    hf = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32
    ).eval()  # ignores the MTP tensors
    cfg = LlamaConfig(**{k: v for k, v in cfg_dict.items() if k != "architectures"})
    cfg._attn_implementation = "eager"
    block = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    block.load_state_dict(
        {
            n: t
            for n, t in mtp.items()
            if n.split(".")[0]
            in ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
        }
    )

    def rms(x, weight):
        norm = LlamaRMSNorm(x.shape[-1], cfg.rms_norm_eps)
        norm.weight.data.copy_(weight)
        return norm(x)

    n = len(prompt)
    with torch.no_grad():
        h = hf(torch.tensor([prompt]), output_hidden_states=True).hidden_states[-1][
            0
        ]  # post final norm
        e = mtp["embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])]
        e[0] = 0  # position 0
        x = (
            torch.cat((rms(e, mtp["enorm.weight"]), rms(h, mtp["hnorm.weight"])), -1)
            @ mtp["eh_proj.weight"].T
        )
        positions = torch.arange(n)[None]
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]
        out = block(
            x[None],
            attention_mask=causal,
            position_ids=positions,
            position_embeddings=LlamaRotaryEmbedding(cfg)(x[None], positions),
        )
        out = out[0] if isinstance(out, tuple) else out
        return rms(out[0], mtp["shared_head.norm.weight"]) @ mtp["shared_head.head.weight"].T


def test_deepseek_mtp_layer_uses_its_own_embedding_and_shared_head(deepseek_mtp_target):
    prompt = [(j * 11) % 300 for j in range(12)]
    first = reference(deepseek_mtp_target, [prompt])[0].token_ids[0]
    ref = mtp_reference_logits(deepseek_mtp_target, prompt, first)
    _, seen = assert_lossless(
        deepseek_mtp_target, None, method="mtp", prompts=[prompt], num_steps=3
    )
    assert int(seen[0][0, 1]) == int(ref[-1].argmax())  # the first proposal is the reference step's
    model = load_model(deepseek_mtp_target, torch.float32)
    layer = model.mtp_layers[0]
    assert not torch.equal(layer.embed_tokens.weight, model.model.embed_tokens.weight)
    n, ids = len(prompt), torch.tensor(prompt + [first])
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
        h = model(ids[:n], torch.arange(n)).hidden_states
        logits = layer.compute_logits(
            model, layer(torch.arange(n), ids[1:], layer.target_state(model, h), model)
        )
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    prompts = [[(i * 37 + j * 11) % 300 for j in range(5 + 7 * i)] for i in range(3)]
    assert_lossless(deepseek_mtp_target, None, method="mtp", prompts=prompts, num_steps=3)
