"""Drafters on hybrid targets (Qwen3-Next, Qwen3.5, Nemotron-H; fp32, CPU, tiny random models).

- The checkpoints' own MTP (``mtp.*``, models/drafts/hybrid_mtp.py): one MTP step, and the second of two chained
  MTP layers, equal a reference written from vLLM's qwen3_next_mtp.py / SGLang's qwen3_5_mtp.py semantics
  (fc over [pre_fc_norm_embedding(embed(t + 1)), pre_fc_norm_hidden(target's post-norm h_t)], then the
  decoder layer and mtp.norm as SGLang runs them: a one-layer text model of transformers' class fed fc's
  output, the target's head); plausible misreadings (the pre-norm target state, the halves swapped, the
  final norm applied again) do not. Through the engine, every draft of every step (one layer reused over
  three steps, or two layers chained) equals that reference recomputed from the committed tokens, also
  after chunked prefill; greedy output equals plain decoding.
- EAGLE3 (aux states captured on hybrids; chains and trees), DFlash (its correct_len / bonus rule is the
  verify's: last_correct_step_indices = correct_len) and the standalone draft are lossless.
- A standalone draft that is itself a hybrid keeps its own state rows with the same rollback: the target
  as its own draft has every draft accepted, a perturbed copy's drafts equal its greedy continuation of
  the committed tokens recomputed from scratch, and skipping the rollback breaks that.
"""

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.hybrid_drafting import MTP_LAYERS, PROMPTS, VOCAB, save_with_mtp
from helpers.hybrid_models import make_hybrid, save_hybrid
from helpers.spec_models import make_dflash_draft, make_eagle3_draft
from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, build_paged_metadata, forward_context
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_cache import bind_kv_cache
from outpace.config import SpeculativeConfig
from outpace.engine import decode_step
from outpace.models.loader import load_model
from outpace.speculative.drafters import draft_model as draft_proposer
from outpace.speculative.drafters import mtp as mtp_proposer
from outpace.validation import ConfigError

GREEDY = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)


def rel_error(a, b):
    return ((a - b).norm() / b.norm()).item()


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory):
    return {
        v: save_with_mtp(v, tmp_path_factory.mktemp(v + "_mtp"), n) for v, n in MTP_LAYERS.items()
    }


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """variant -> checkpoint directory, without MTP layers."""
    return {
        v: save_hybrid(make_hybrid(v, vocab_size=VOCAB), tmp_path_factory.mktemp(v))
        for v in ("qwen3_next", "qwen3_5", "nemotron_h")
    }


def plain_outputs(path, prompts, params=GREEDY):
    return [o.token_ids for o in LLM(str(path), block_size=4).generate(prompts, params)]


# ---- the MTP reference (vLLM / SGLang semantics) -----------------------------------------------------------


class ReferenceMTP:
    """The checkpoint's MTP as vLLM and SGLang compute it, from its tensors by name and transformers' classes."""

    def __init__(self, hf, path):
        self.hf, self.tensors = hf, load_file(path / "model.safetensors")
        self.eps = hf.config.rms_norm_eps
        self.layers = [
            self._layer_model(k)
            for k in range(json.loads((path / "config.json").read_text())["mtp_num_hidden_layers"])
        ]

    def _layer_model(self, k):
        """SGLang Qwen3_5ForCausalLMMTP: the text model class with num_hidden_layers 1 (full attention), fed
        fc's output as input embeddings; its final norm is mtp.norm (vLLM: self.norm after the layer)."""
        cfg = copy.deepcopy(self.hf.config)
        cfg.num_hidden_layers, cfg.layer_types = 1, ["full_attention"]
        model = type(self.hf.model)(cfg).eval()
        prefix, state = f"mtp.layers.{k}.", {}
        for name, t in self.tensors.items():
            if name.startswith(prefix):
                state["layers.0." + name[len(prefix) :]] = t
        experts = {n for n in state if ".mlp.experts." in n}
        if (
            experts
        ):  # transformers stacks the experts: gate_up_proj [E, 2I, H] (gate rows first), down_proj
            e_count = self.hf.config.num_experts
            get = lambda e, w: state.pop(f"layers.0.mlp.experts.{e}.{w}.weight")  # noqa: E731
            gate_up = [torch.cat([get(e, "gate_proj"), get(e, "up_proj")]) for e in range(e_count)]
            state["layers.0.mlp.experts.gate_up_proj"] = torch.stack(gate_up)
            state["layers.0.mlp.experts.down_proj"] = torch.stack(
                [get(e, "down_proj") for e in range(e_count)]
            )
        state["norm.weight"] = self.tensors["mtp.norm.weight"]
        state["embed_tokens.weight"] = self.tensors["model.embed_tokens.weight"]
        model.load_state_dict(state, strict=True)
        return model

    def norm(self, x, name):
        """Qwen3NextRMSNorm / vLLM GemmaRMSNorm: x / rms(x) * (1 + w)."""
        return (
            x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.tensors[name])
        )

    def target_state(self, ids):
        """The target's last hidden state after its final norm (vLLM Qwen3NextModel returns it normed)."""
        return self.hf.model(ids[None]).last_hidden_state[0]

    def step(self, k, next_ids, hidden, swap=False):
        """MTP layer k over rows t = 0 .. n - 1 (position t): next_ids [n] the tokens t + 1, hidden [n, H] ->
        its output [n, H] (after mtp.norm), which the head reads and a further step is fed."""
        e = self.norm(self.hf.model.embed_tokens(next_ids), "mtp.pre_fc_norm_embedding.weight")
        h = self.norm(hidden, "mtp.pre_fc_norm_hidden.weight")
        x = torch.cat([h, e] if swap else [e, h], dim=-1) @ self.tensors["mtp.fc.weight"].T
        pos = torch.arange(x.shape[0])[None]
        return self.layers[k](
            inputs_embeds=x[None], position_ids=pos, use_cache=False
        ).last_hidden_state[0]

    def logits(self, out):
        return self.hf.lm_head(out)

    def drafts(self, seq, num_steps):
        """Greedy drafts after the committed tokens ``seq`` (the last at position L = len(seq) - 1): rows
        0 .. L - 1 read the target's states; chained layers (k >= 1) read layer k - 1's outputs; a single
        layer reused appends one row per step at L, L + 1, ... reading the last draft and the last output."""
        seq = torch.tensor(seq)
        L = len(seq) - 1
        target = self.target_state(seq[:L])
        out = self.step(0, seq[1:], target)
        tokens = [int(self.logits(out[-1]).argmax())]
        if len(self.layers) > 1:
            for k in range(1, num_steps):
                ids = torch.cat([seq, torch.tensor(tokens)])[k + 1 : L + k + 1]
                out = self.step(k, ids, out)
                tokens.append(int(self.logits(out[-1]).argmax()))
            return tokens
        ids, hidden = seq[1:], target
        for _ in range(1, num_steps):
            ids, hidden = torch.cat([ids, torch.tensor(tokens[-1:])]), torch.cat([hidden, out[-1:]])
            out = self.step(0, ids, hidden)
            tokens.append(int(self.logits(out[-1]).argmax()))
        return tokens


class NemotronReferenceMTP(ReferenceMTP):
    """Nemotron-H's MTP as vLLM's nemotron_h_mtp.py computes it: [enorm(embed) | hnorm(h)] through eh_proj, then
    the mtp.layers.* blocks and final_layernorm, here transformers' NemotronHForCausalLM built with those blocks
    (its norm_f the final_layernorm, its embeddings and head the target's) from the checkpoint's tensors."""

    def __init__(self, hf, path):
        import transformers

        self.hf, self.tensors = hf, load_file(path / "model.safetensors")
        self.eps = hf.config.layer_norm_epsilon
        config = json.loads((path / "config.json").read_text())
        kinds = hf.config.mtp_layers_block_type
        last = f"mtp.layers.{len(kinds) - 1}.final_layernorm.weight"
        state = {
            "backbone.layers." + name.removeprefix("mtp.layers."): t
            for name, t in self.tensors.items()
            if name.startswith("mtp.layers.") and name.split(".")[3] in ("norm", "mixer")
        }
        state.update(
            {
                "backbone.norm_f.weight": self.tensors[last],
                "backbone.embeddings.weight": self.tensors["backbone.embeddings.weight"],
                "lm_head.weight": self.tensors["lm_head.weight"],
            }
        )
        stack = path.parent / (path.name + "-mtp-reference")
        stack.mkdir(exist_ok=True)
        config.update(
            layers_block_type=kinds, num_hidden_layers=len(kinds), num_nextn_predict_layers=0
        )
        config.pop("hybrid_override_pattern", None)
        (stack / "config.json").write_text(json.dumps(config))
        save_file(state, stack / "model.safetensors", metadata={"format": "pt"})
        model = transformers.AutoModelForCausalLM.from_pretrained(stack, dtype=torch.float32)
        self.layers = [model.eval().base_model]
        self.final = last

    def norm(self, x, name):
        """NemotronHRMSNorm: x / rms(x) * w."""
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.tensors[name]

    def step(self, k, next_ids, hidden, swap=False):
        e = self.norm(self.hf.get_input_embeddings()(next_ids), "mtp.layers.0.enorm.weight")
        h = self.norm(hidden, "mtp.layers.0.hnorm.weight")
        x = (
            torch.cat([h, e] if swap else [e, h], dim=-1)
            @ self.tensors["mtp.layers.0.eh_proj.weight"].T
        )
        return self.layers[k](inputs_embeds=x[None], use_cache=False).last_hidden_state[0]


def reference_mtp(variant, hf, path) -> ReferenceMTP:
    return (NemotronReferenceMTP if variant.startswith("nemotron_h") else ReferenceMTP)(hf, path)


def paged(fn, n):
    with forward_context(build_paged_metadata([[5, 2, 7]], [0], [n], 16, "cpu")):
        return fn()


@pytest.mark.parametrize("variant", list(MTP_LAYERS))
def test_mtp_steps_match_the_reference(variant, mtp_targets):
    """One MTP step over a sequence (and with two layers, the chained second) equals vLLM/SGLang's semantics;
    the pre-norm target state, swapped fc halves or the target's final norm applied again do not."""
    hf, path = mtp_targets[variant]
    ref, model = reference_mtp(variant, hf, path), load_model(path, torch.float32)
    assert model.config.num_nextn_predict_layers == MTP_LAYERS[variant]
    ids = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(2))
    n = ids.shape[0] - 1
    with torch.no_grad():
        bind_kv_cache(model.model, BlockPool(8, 16), torch.float32, "cpu")
        bind_kv_cache(model.mtp_layers, BlockPool(8, 16), torch.float32, "cpu")
        pre_norm = paged(lambda: model(ids[:n], torch.arange(n)).hidden_states, n)
        prev, ref_prev = (
            model.mtp_layers[0].target_state(model, pre_norm),
            ref.target_state(ids[:n]),
        )
        for k, layer in enumerate(model.mtp_layers):
            m = n - k
            ours = paged(lambda: layer(torch.arange(m), ids[k + 1 :], prev[:m], model), m)
            expected = ref.step(k, ids[k + 1 :], ref_prev[:m])
            logits = layer.compute_logits(model, ours)
            assert rel_error(logits, ref.logits(expected)) < 1e-4, k
            if k == 0:  # each misreading moves the logits far past that tolerance
                for wrong in (
                    ref.step(0, ids[1:], pre_norm),
                    ref.step(0, ids[1:], ref_prev, swap=True),
                    model.model.norm(expected),
                ):
                    assert rel_error(logits, ref.logits(wrong)) > 1e-2
            prev, ref_prev = ours, expected


def run_recording_drafts(path, prompt, num_steps, monkeypatch, chunk=2048):
    """Greedy output of one prompt with MTP drafting, and (L, drafts) of every draft step."""
    record, real = [], mtp_proposer.chain_drafts

    def recording(rows, tokens, probs):
        record.append((int(rows.lengths[0]), torch.stack(tokens, 1)[0].tolist()))
        return real(rows, tokens, probs)

    monkeypatch.setattr(mtp_proposer, "chain_drafts", recording)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=chunk,
        speculative=SpeculativeConfig("mtp", num_steps=num_steps),
    )
    out = llm.generate([prompt], GREEDY)[0]
    assert llm.engine.pool.num_free == 64
    return out, record


@pytest.mark.parametrize("variant", list(MTP_LAYERS))
def test_mtp_drafts_chained_over_steps_follow_the_reference(variant, mtp_targets, monkeypatch):
    """Every draft the engine's MTP proposes (Qwen3-Next: its one layer reused for 3 steps; Qwen3.5: two
    layers chained) is the reference's greedy draft after the tokens committed then; output is lossless and
    some drafts are accepted (so rows were rolled back after rejections and kept after acceptances)."""
    hf, path = mtp_targets[variant]
    ref, steps = reference_mtp(variant, hf, path), 3 if MTP_LAYERS[variant] == 1 else 2
    plain = plain_outputs(path, PROMPTS)
    accepted = 0
    for prompt, expected in zip(PROMPTS, plain):
        for chunk in (2048, 4):
            out, record = run_recording_drafts(path, prompt, steps, monkeypatch, chunk)
            assert out.token_ids == expected
            accepted += out.spec_metrics.num_accepted_drafts
            seq = prompt + expected
            with torch.no_grad():
                for L, drafts in record:
                    assert drafts == ref.drafts(seq[: L + 1], steps), (prompt, L, chunk)
    assert accepted > 0


@pytest.mark.parametrize("variant", list(MTP_LAYERS))
def test_mtp_lossless_batched_and_preempted(variant, mtp_targets):
    _, path = mtp_targets[variant]
    expected = plain_outputs(path, PROMPTS)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=10,
        max_num_batched_tokens=8,
        speculative=SpeculativeConfig("mtp", num_steps=MTP_LAYERS[variant]),
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.num_preemptions for o in outs) > 0, (
        "the pool was meant to force preemption"
    )
    assert llm.engine.pool.num_free == 10


def test_target_without_mtp_layers_refuses_mtp(targets):
    with pytest.raises(Exception, match="num_nextn_predict_layers = 0"):
        LLM(str(targets["qwen3_next"]), speculative=SpeculativeConfig("mtp", num_steps=1))


def _with_config(source, path, **fields):
    """A copy of checkpoint ``source`` at ``path`` with config.json's ``fields`` set (None: removed)."""
    path = shutil.copytree(source, path)
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    config = {k: v for k, v in config.items() if v is not None}
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_nemotron_h_mtp_in_the_published_config_forms(mtp_targets, targets, tmp_path):
    """Nemotron 3 Super's config.json names its MTP blocks with the older ``mtp_hybrid_override_pattern`` ("*E")
    or block types ("attention"): the same drafts. A checkpoint whose config counts no MTP layer skips the
    mtp.* tensors it carries; an MTP stack outpace does not build is refused by name."""
    hf, source = mtp_targets["nemotron_h"]
    plain = plain_outputs(source, PROMPTS)
    spec = SpeculativeConfig("mtp", num_steps=3)
    expected = [o.token_ids for o in LLM(str(source), speculative=spec).generate(PROMPTS, GREEDY)]
    assert expected == plain
    for name, fields in {
        "pattern": dict(mtp_layers_block_type=None, mtp_hybrid_override_pattern="*E"),
        "legacy-names": dict(mtp_layers_block_type=["attention", "moe"]),
    }.items():
        path = _with_config(source, tmp_path / name, **fields)
        llm = LLM(str(path), speculative=spec)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected, name
    unused = _with_config(source, tmp_path / "no-mtp", num_nextn_predict_layers=0)
    assert plain_outputs(unused, PROMPTS) == plain
    with pytest.raises(Exception, match="num_nextn_predict_layers = 0"):
        LLM(str(unused), speculative=spec)
    for field, value in {
        "num_nextn_predict_layers": 2,
        "mtp_layers_block_type": ["full_attention", "linear_attention"],
    }.items():
        with pytest.raises(ConfigError, match=field):
            LLM(str(_with_config(source, tmp_path / field, **{field: value})))


# ---- EAGLE3, DFlash, standalone drafts ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_eagle3_is_lossless(variant, shape, targets, tmp_path):
    path = targets[variant]
    draft = make_eagle3_draft(path, tmp_path / "eagle3")
    spec = (
        SpeculativeConfig("eagle3", str(draft), num_steps=3)
        if shape == "chain"
        else SpeculativeConfig("eagle3", str(draft), num_steps=3, topk=2, num_draft_tokens=6)
    )
    llm = LLM(str(path), block_size=4, num_kv_blocks=64, max_num_batched_tokens=8, speculative=spec)
    assert llm.engine.proposer.aux_layer_ids  # the hybrid captures its layers' inputs
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == plain_outputs(path, PROMPTS)
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0
    assert llm.engine.pool.num_free == 64


@pytest.mark.parametrize("variant", ["qwen3_next", "qwen3_5"])
def test_dflash_is_lossless_with_its_correct_len_rule(variant, targets, tmp_path, monkeypatch):
    """DFlash's rule (the seed review): correct_len = cumprod(candidates[:, 1:] == target_predict[:, :-1]).sum(1),
    bonus = target_predict[correct_len]; on a hybrid the state kept is the snapshot at correct_len."""
    path = targets[variant]
    layers = json.loads((path / "config.json").read_text())["num_hidden_layers"]
    draft = make_dflash_draft(
        path, tmp_path / "dflash", layer_ids=tuple(range(layers)), mask_token_id=VOCAB - 1
    )
    expected = plain_outputs(path, PROMPTS)
    checked, real = [], decode_step.accept_greedy_chain

    def checking(drafts, predict):  # predict [b, k + 1]: the target's argmax (its greedy_tokens)
        result = real(drafts, predict)
        correct_len = (drafts == predict[:, :-1]).int().cumprod(1).sum(1)
        assert torch.equal(result.num_correct_drafts, correct_len)
        assert torch.equal(result.last_correct_step_indices, correct_len)
        assert torch.equal(result.bonus_token_ids, predict.gather(1, correct_len[:, None])[:, 0])
        checked.append(drafts.shape[1])
        return result

    monkeypatch.setattr(decode_step, "accept_greedy_chain", checking)
    llm = LLM(
        str(path),
        block_size=4,
        num_kv_blocks=64,
        speculative=SpeculativeConfig("dflash", str(draft), num_steps=3),
    )
    outs = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert checked and set(checked) == {3}
    assert sum(o.spec_metrics.num_accepted_drafts for o in outs) > 0


@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
def test_a_hybrid_as_its_own_draft_has_every_draft_accepted(variant, targets):
    """The draft's own state rows carry the state over prefill chunks and steps: drafting with the target
    itself, every verify accepts all drafts (the last, cut short by max_tokens, excepted)."""
    path = targets[variant]
    for chunk in (2048, 4):
        llm = LLM(
            str(path),
            block_size=4,
            num_kv_blocks=64,
            max_num_batched_tokens=chunk,
            speculative=SpeculativeConfig("draft", str(path), num_steps=3),
        )
        outs = llm.generate(PROMPTS, GREEDY)
        assert [o.token_ids for o in outs] == plain_outputs(path, PROMPTS)
        for o in outs:
            assert sum(o.spec_metrics.histogram[:-1]) <= 1, o.spec_metrics.histogram
        assert llm.engine.pool.num_free == 64


@pytest.fixture(scope="module")
def perturbed_draft(targets, tmp_path_factory):
    """The Qwen3-Next target with noise on its head: it agrees with the target often, not always."""
    path = tmp_path_factory.mktemp("perturbed")
    for f in targets["qwen3_next"].iterdir():
        shutil.copy(f, path / f.name)
    tensors = load_file(path / "model.safetensors")
    g = torch.Generator().manual_seed(5)
    tensors["lm_head.weight"] = tensors["lm_head.weight"] + 0.1 * torch.randn(
        tensors["lm_head.weight"].shape, generator=g
    )
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def draft_reference(model, seq, num_steps):
    """The draft's greedy continuation of ``seq``, each token recomputed from scratch (zero state)."""
    seq, out = list(seq), []
    with torch.no_grad():
        for _ in range(num_steps):
            with forward_context(DenseCausalMetadata(1, len(seq))):
                h = model(torch.tensor(seq), torch.arange(len(seq))).hidden_states[-1:]
            out.append(int(model.compute_logits(h).argmax()))
            seq.append(out[-1])
    return out


def drafts_of_a_run(target, draft, prompt, monkeypatch, skip_rollback=False):
    record, real = [], draft_proposer.chain_drafts
    monkeypatch.setattr(
        draft_proposer,
        "chain_drafts",
        lambda rows, tokens, probs: (
            record.append((int(rows.lengths[0]), torch.stack(tokens, 1)[0].tolist())),
            real(rows, tokens, probs),
        )[1],
    )
    llm = LLM(
        str(target),
        block_size=4,
        num_kv_blocks=64,
        max_num_batched_tokens=4,
        speculative=SpeculativeConfig("draft", str(draft), num_steps=3),
    )
    if skip_rollback:  # the state after the draft steps stays: commit only before them
        states, commit, calls = llm.engine.proposer.states, llm.engine.proposer.states.commit, []
        states.commit = lambda indices, rows: (
            calls.append(1),
            len(calls) % 2 and commit(indices, rows),
        )
    return llm.generate([prompt], GREEDY)[0], record


def test_a_hybrid_draft_rolls_its_state_back(targets, perturbed_draft, monkeypatch):
    """Each draft of a hybrid draft model equals its greedy continuation of the committed tokens recomputed
    from scratch, across rejections (state rolled back to the last committed token) and chunked prefill;
    without the rollback they do not."""
    target = targets["qwen3_next"]
    model = load_model(perturbed_draft, torch.float32)
    plain = plain_outputs(target, PROMPTS)
    histogram = [0] * 4
    for prompt, expected in zip(PROMPTS, plain):
        out, record = drafts_of_a_run(target, perturbed_draft, prompt, monkeypatch)
        assert out.token_ids == expected
        histogram = [a + b for a, b in zip(histogram, out.spec_metrics.histogram)]
        seq = prompt + expected
        for L, drafts in record:
            assert drafts == draft_reference(model, seq[: L + 1], 3), (prompt, L)
    assert histogram[0] and sum(histogram[1:]), (
        histogram
    )  # rejections and acceptances both happened
    out, record = drafts_of_a_run(
        target, perturbed_draft, PROMPTS[0], monkeypatch, skip_rollback=True
    )
    assert out.token_ids == plain[0]
    seq = PROMPTS[0] + plain[0]
    assert any(drafts != draft_reference(model, seq[: L + 1], 3) for L, drafts in record)
