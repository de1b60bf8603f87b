"""DFlash drafts: the training forward equals the serving forward, serving is lossless (greedy, with chunked
prefill, preemption and accepted blocks; seeded sampling reproduces), misfits are refused, and a toy
training run saves a draft that loads and serves."""

import json
import math
import shutil

import pytest
import torch

from helpers.hf_models import make_hf_model, save_hf_model
from helpers.spec_models import dflash_config_dict, make_dflash_draft
from outpace import LLM, SamplingParams
from outpace.attention import build_paged_metadata, forward_context
from outpace.config import SpeculativeConfig
from outpace.models.drafts.dflash import DFlashConfig, dflash_block_size, load_dflash_draft
from outpace.models.drafts.eagle3 import DraftMismatchError
from outpace.models.loader import load_model
from outpace.train.distill import teacher_forward
from outpace.train.recipes.dflash import (
    block_inputs,
    default_target_layer_ids,
    dflash_forward,
    sample_anchors,
)
from outpace.validation import ConfigError

BLOCK = 4
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def target4(tmp_path_factory):
    return save_hf_model(
        make_hf_model("llama", num_hidden_layers=4), tmp_path_factory.mktemp("target4")
    )


@pytest.fixture(scope="module")
def draft4(target4, tmp_path_factory):
    return make_dflash_draft(target4, tmp_path_factory.mktemp("dflash4"))


def prompts(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 200, (3 + 5 * i,), generator=g).tolist() for i in range(n)]


@pytest.fixture(scope="module")
def reference(target4):
    """Prompts and their greedy continuations without speculation (long enough for oracle drafts)."""
    ps = prompts(6)
    outs = LLM(str(target4), block_size=4).generate(
        ps, GREEDY.replace(max_tokens=GREEDY.max_tokens + 2 * BLOCK)
    )
    return ps, [o.token_ids for o in outs]


# ---------------------------------------------------------------------------------------------
# (a) the dense training forward equals the paged serving forward


def serving_block(
    draft,
    features,
    a,
    table,
    block_size=4,
    chunks=(0.5,),
    skip_row=None,
    causal=False,
    position_shift=0,
):
    """The serving path for one request: write context rows 0 .. a - 1 (in chunks) into the paged KV,
    then the block [x_a, mask...] at rows a .. a + B - 1. Variants build deliberately wrong serving."""
    cuts = [0] + [int(a * c) for c in chunks] + [a]
    for lo, hi in zip(cuts, cuts[1:]):
        rows = [r for r in range(lo, hi) if r != skip_row]
        if not rows:
            continue
        meta = build_paged_metadata([table], [0], [a + draft.config.block_size], block_size, "cpu")
        indices = meta.slot_mapping[rows]
        draft.write_context(features[rows], torch.tensor(rows), indices)
    n = draft.config.block_size
    mask = None if causal else torch.ones(n, n, dtype=torch.bool)
    meta = build_paged_metadata([table], [a], [n], block_size, "cpu", [mask])
    return meta


def test_training_forward_equals_paged_serving(target4, draft4):
    from outpace.cache.block_pool import BlockPool
    from outpace.cache.kv_cache import bind_kv_cache

    target = load_model(target4, torch.float32, progress=False)
    draft = load_dflash_draft(draft4, target, torch.float32, "cpu")
    cfg = draft.config
    n = cfg.block_size
    g = torch.Generator().manual_seed(0)
    t = 19
    tokens = torch.randint(0, 200, (1, t), generator=g)
    aux = torch.randn(1, t, cfg.num_features * 48, generator=g)
    anchors = torch.tensor([[1, 6, 11, 15]])
    with torch.no_grad():
        dense = dflash_forward(draft, draft.embed, aux, tokens, anchors)[0]  # [K, B, hidden]
        features = draft.fuse(aux[0])
    table = [5, 2, 7, 0, 3, 6]  # 24 rows of 4, deliberately out of order
    bind_kv_cache(draft, BlockPool(8, 4), torch.float32, "cpu")

    def serve(a, **variant):
        for layer in draft.layers:  # stale garbage everywhere: a row that is not written shows
            for cache in layer.self_attn.attn.kv_cache:
                cache.copy_(torch.randn(cache.shape, generator=g))
        shift = variant.pop("position_shift", 0)
        with torch.no_grad():
            meta = serving_block(draft, features, a, table, **variant)
            ids = torch.tensor([tokens[0, a].item()] + [cfg.mask_token_id] * (n - 1))
            with forward_context(meta):
                return draft(ids, torch.arange(a, a + n) + shift)

    for k, a in enumerate(anchors[0].tolist()):
        out = serve(a)
        assert (out - dense[k]).abs().max() < 1e-5, (a, (out - dense[k]).abs().max())
        if a >= 6:  # the test can tell a wrong serving path
            assert (serve(a, causal=True) - dense[k]).abs().max() > 1e-3
            assert (serve(a, skip_row=a // 3) - dense[k]).abs().max() > 1e-3
            assert (serve(a, position_shift=1) - dense[k]).abs().max() > 1e-3
            assert (serve(a, chunks=(0.2, 0.7)) - dense[k]).abs().max() < 1e-5


def test_block_inputs_and_anchors():
    tokens = torch.arange(10)[None] + 100
    ids, pos, mask = block_inputs(tokens, torch.tensor([[2, 5]]), 3, mask_token_id=7)
    assert ids.tolist() == [[102, 7, 7, 105, 7, 7]] and pos.tolist() == [[2, 3, 4, 5, 6, 7]]
    ctx, own = mask[0, :, :10], mask[0, :, 10:]
    assert ctx.sum(1).tolist() == [2, 2, 2, 5, 5, 5] and ctx[:3, :2].all() and ctx[3:, :5].all()
    assert own.tolist() == [[r // 3 == c // 3 for c in range(6)] for r in range(6)]
    a = sample_anchors(64, 20, 4, 6, torch.Generator().manual_seed(0))
    assert a.min() >= 1 and a.max() <= 17 and (a.diff(dim=1) > 0).all()
    assert default_target_layer_ids(6) == (1, 3, 5) and default_target_layer_ids(3) == (1, 2)
    assert default_target_layer_ids(32) == (1, 16, 31) and default_target_layer_ids(1) == (0,)


# ---------------------------------------------------------------------------------------------
# (b) lossless greedy serving, and the draft state checked against a from-scratch recomputation


def _tight_llm(target, draft, **kwargs):
    spec = SpeculativeConfig("dflash", str(draft), num_steps=BLOCK - 1)
    return LLM(
        str(target),
        block_size=4,
        num_kv_blocks=kwargs.pop("num_kv_blocks", 30),
        max_num_batched_tokens=16,
        speculative=spec,
        **kwargs,
    )


def _rows_requests(llm, rows):
    """The request of each row of a decode batch (None: a padding row)."""
    engine = llm.engine
    by_slot = {engine.runner.req_table.index_of(r.request_id): r for r in engine.scheduler.running}
    return [by_slot.get(s) for s in rows.req_indices.tolist()]


def _record_blocks(llm, monkeypatch):
    """Record (tokens, L, logits) of every request at every block forward (greedy or sampled, every draft
    reads the block's rows 1 .. k: ``block_rows``)."""
    records = []
    proposer = llm.engine.proposer
    original = proposer.block_rows

    def recording(rows, k):
        hidden = original(rows, k)  # [b * k, hidden]
        logits = proposer.draft_model.compute_logits(hidden).view(rows.size, k, -1)
        requests = _rows_requests(llm, rows)
        records.extend(
            (list(r.token_ids), L, logits[i].clone())
            for i, (r, L) in enumerate(zip(requests, rows.lengths.tolist()))
            if r is not None
        )
        return hidden

    monkeypatch.setattr(proposer, "block_rows", recording)
    return records


def _check_against_recomputation(llm, records, limit=60):
    """Each recorded block's logits equal a dense recomputation from the target's features of tokens[:L]."""
    target, draft = llm.engine.model, llm.engine.proposer.draft_model
    assert records
    step = max(1, len(records) // limit)
    for tokens, L, logits in records[::step]:
        assert len(tokens) == L + 1
        x = torch.tensor(tokens)[None]
        with torch.no_grad():
            aux = teacher_forward(target, x).aux_hidden_states.view(1, L + 1, -1)
            hidden = dflash_forward(draft, draft.embed, aux, x, torch.tensor([[L]]))
            ref = draft.compute_logits(hidden[0, 0, 1:])
        assert (ref - logits).abs().max() < 1e-4, (L, (ref - logits).abs().max())


def test_random_dflash_is_lossless_chunked_and_preempted(target4, draft4, reference, monkeypatch):
    ps, full = reference
    expected = [t[: GREEDY.max_tokens] for t in full]
    llm = _tight_llm(target4, draft4)
    records = _record_blocks(llm, monkeypatch)
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert sum(o.metrics.num_preemptions for o in outs) > 0, (
        "the pool was meant to force preemption"
    )
    assert llm.engine.pool.num_free == 30
    proposer = llm.engine.proposer
    # target_layer_ids (0, 1, 3) mean outputs of those layers: the inputs of 1, 2 and 4 (4 = the last output)
    assert proposer.aux_layer_ids == llm.engine.model.aux_layer_ids == (1, 2, 4)
    assert proposer.lookahead == BLOCK - 1
    _check_against_recomputation(llm, records)


def test_right_drafts_are_accepted_and_state_stays_exact(target4, draft4, reference, monkeypatch):
    """Drafts replaced by the true continuation: whole blocks are accepted, output is unchanged, and
    the draft's KV after accepted blocks still equals a from-scratch recomputation."""
    ps, full = reference
    truth = {tuple(p): p + f for p, f in zip(ps, full)}
    llm = _tight_llm(target4, draft4, num_kv_blocks=24)
    records = _record_blocks(llm, monkeypatch)
    proposer = llm.engine.proposer
    original = proposer.draft

    def oracle(rows, shape):
        drafts = original(rows, shape)
        drafts.token_ids = drafts.token_ids.clone()
        for i, r in enumerate(_rows_requests(llm, rows)):
            if r is not None:
                seq = truth[tuple(r.prompt_token_ids)]
                drafts.token_ids[i, 1:] = torch.tensor(seq[r.num_tokens : r.num_tokens + BLOCK - 1])
        return drafts

    monkeypatch.setattr(proposer, "draft", oracle)
    outs = llm.generate(ps, GREEDY)
    assert [o.token_ids for o in outs] == [t[: GREEDY.max_tokens] for t in full]
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert llm.engine.pool.num_free == 24
    verifies = sum(o.spec_metrics.num_verifies for o in outs)
    tau = (
        sum(o.spec_metrics.num_accepted_drafts + o.spec_metrics.num_verifies for o in outs)
        / verifies
    )
    assert tau > BLOCK - 0.5, tau
    _check_against_recomputation(llm, records)


# ---------------------------------------------------------------------------------------------
# (c) sampling


def test_seeded_sampling_reproduces_and_greedy_rows_stay_exact(target4, draft4, reference):
    ps, full = reference
    sampled = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=i, ignore_eos=True)
        for i in range(3)
    ]
    params = sampled + [GREEDY.replace(max_tokens=16)] * 2
    runs = [
        [
            o.token_ids
            for o in _tight_llm(target4, draft4, num_kv_blocks=64).generate(ps[:5], params)
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and all(len(t) == 16 for t in runs[0])
    assert runs[0][3:] == [t[:16] for t in full[3:5]]


# ---------------------------------------------------------------------------------------------
# (d) misfits and misuse are refused with clear errors


def _edit(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    for key, value in changes.items():
        if key in ("mask_token_id", "target_layer_ids"):
            cfg["dflash_config"][key] = value
        else:
            cfg[key] = value
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_misfits_and_misuse_are_refused(target4, draft4, tmp_path):
    target = load_model(target4, torch.float32, progress=False)
    deep = _edit(
        draft4, tmp_path / "layers", target_layer_ids=[0, 1, 4]
    )  # the target has layers 0 .. 3
    cases = {
        r"target_layer_ids \[0, 1, 4\] name layers \[4\]": deep,
        r"mask_token_id 203 is outside the target vocabulary \[0, 203\)": _edit(
            draft4, tmp_path / "mask", mask_token_id=203
        ),
        "vocab_size 999": _edit(draft4, tmp_path / "vocab", vocab_size=999),
        "num_target_layers 6": _edit(draft4, tmp_path / "depth", num_target_layers=6),
        "target hidden size is 48": make_dflash_draft(target4, tmp_path / "wide", target_hidden=64),
    }
    for message, path in cases.items():
        with pytest.raises(DraftMismatchError, match=message):
            load_dflash_draft(path, target, torch.float32, "cpu")
    with pytest.raises(DraftMismatchError, match=r"layers \[4\]"):  # through the engine too
        LLM(str(target4), speculative=SpeculativeConfig("dflash", str(deep), num_steps=3))
    with pytest.raises(
        ConfigError,
        match=r"num_steps=2 is invalid.*config\.json: \S*block_size is 4.*num_steps \+ 1 \(= 3\)",
    ):
        LLM(str(target4), speculative=SpeculativeConfig("dflash", str(draft4), num_steps=2))
    with pytest.raises(ConfigError, match="topk"):
        LLM(
            str(target4),
            speculative=SpeculativeConfig(
                "dflash", str(draft4), num_steps=3, topk=2, num_draft_tokens=4
            ),
        )
    with pytest.raises(ConfigError, match="no mask_token_id"):
        DFlashConfig.from_dict(
            {k: v for k, v in dflash_config_dict(target4).items() if k != "dflash_config"}
        )


def test_mask_token_must_be_the_tokenizers(zoo_like_dir, tmp_path):
    target = load_model(zoo_like_dir, torch.float32, progress=False)
    good = make_dflash_draft(zoo_like_dir, tmp_path / "good", mask_token_id=2, layer_ids=(1, 2))
    load_dflash_draft(good, target, torch.float32, "cpu")
    bad = make_dflash_draft(zoo_like_dir, tmp_path / "bad", mask_token_id=7, layer_ids=(1, 2))
    with pytest.raises(
        DraftMismatchError,
        match=r"mask_token_id 7 is not the target tokenizer's mask token "
        r"'<\|mask\|>' \(id 2\)",
    ):
        load_dflash_draft(bad, target, torch.float32, "cpu")


# ---------------------------------------------------------------------------------------------
# (e) a toy training run


@pytest.fixture(scope="module")
def toy_run(peaked_target, tmp_path_factory):
    from outpace.train.recipes.dflash import DFlashRecipe, train_dflash

    out = tmp_path_factory.mktemp("dflash_toy")
    recipe = DFlashRecipe.toy()
    return peaked_target, out, recipe, train_dflash(peaked_target, recipe, out, "cpu")


def test_toy_run_trains_saves_loads_and_serves(toy_run):
    from safetensors import safe_open

    target_dir, out, recipe, metrics = toy_run
    losses = metrics["history"]["losses"]
    assert losses[-1] < losses[0] - 0.3, losses
    extra = metrics["history"]["extra"]
    assert set(extra) == {
        f"{k} pos {i}" for k in ("loss", "top1") for i in range(1, recipe.block_size)
    }
    assert all(0.0 <= v <= 1.0 for v in metrics["final_position_top1"].values())
    w = metrics["position_weights"]
    assert w[0] == 1.0 and math.isclose(w[1], math.exp(-1 / recipe.loss_gamma))

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["torch_dtype"] == "bfloat16"
    assert cfg["dflash_config"] == {
        "block_size": recipe.block_size,
        "mask_token_id": 2,
        "target_layer_ids": [1, 2],
    }
    assert cfg["num_target_layers"] == 3 and cfg["num_hidden_layers"] == recipe.num_layers
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("fc.weight").dtype == torch.bfloat16
        assert tuple(f.get_tensor("fc.weight").shape) == (48, 2 * 48)
    assert {
        "fc.weight",
        "hidden_norm.weight",
        "norm.weight",
        "layers.0.self_attn.q_norm.weight",
        "layers.0.self_attn.k_norm.weight",
        "layers.0.mlp.down_proj.weight",
    } <= names
    assert not any("embed" in n or "lm_head" in n for n in names)
    assert (out / "README.md").read_text().count("Block training") == 1 and (
        out / "loss.png"
    ).is_file()

    target = load_model(target_dir, torch.float32, progress=False)
    draft = load_dflash_draft(out, target, torch.float32, "cpu")
    assert draft.config.capture_layer_ids == (2, 3) and dflash_block_size(out) == recipe.block_size
    ps = prompts(3)
    expected = [
        o.token_ids
        for o in LLM(str(target_dir), block_size=4).generate(ps, GREEDY.replace(max_tokens=12))
    ]
    spec = SpeculativeConfig("dflash", str(out), num_steps=recipe.block_size - 1)
    outs = LLM(str(target_dir), block_size=4, speculative=spec).generate(
        ps, GREEDY.replace(max_tokens=12)
    )
    assert [o.token_ids for o in outs] == expected
