"""bench/widen_deepseek.py, widen_hybrid.py, widen_gemma.py (and widen_families.py): the zoo's DeepSeek,
Qwen3.5 and Gemma targets, their MTP layers and EAGLE3 drafts, widened at the small test shapes
(``DS_TINY``, ``QWEN35_TINY``, ``GEMMA_TINY``: every map exercised, float32 on the CPU), compute the zoo's
functions: the same logits (1e-4) and greedy tokens, the stream exactly zero on the padded dims and t
times the zoo's on the real ones; through the engine, the same tokens and acceptance for every drafter;
``bench e2e --family ... --tiny`` end to end; in bf16, greedy tokens that part only at the float32 zoo's near ties;
and a wrong map is caught."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from outpace import LLM, SamplingParams
from outpace.attention import DenseCausalMetadata, forward_context
from outpace.bench import widen_families
from outpace.bench.e2e import FAMILIES as E2E_FAMILIES
from outpace.bench.e2e import run_e2e_bench
from outpace.bench.widen_deepseek import (
    DS_TINY,
    DS_TINY_DRAFT,
    V2_LITE,
    DeepseekWidening,
    expert_layout,
    widen_deepseek_zoo,
)
from outpace.bench.widen_families import Stream, gqa_heads
from outpace.bench.widen_gemma import GEMMA_TINY, GEMMA_TINY_DRAFT, widen_gemma_zoo
from outpace.bench.widen_hybrid import QWEN35_TINY, QWEN35_TINY_DRAFT, eps_factor, widen_hybrid_zoo
from outpace.config import SpeculativeConfig
from outpace.layers.router import Router, Routing
from outpace.models.drafts.eagle3 import load_eagle3_draft, target_capture_ids
from outpace.models.loader import load_model

ZOO = Path(__file__).resolve().parents[2] / "zoo"
PROMPTS = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:3]
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
# family -> (widening, its tiny target and draft shapes, zoo target, zoo draft, MTP layers)
FAMILIES = {
    "deepseek": (widen_deepseek_zoo, DS_TINY, DS_TINY_DRAFT, "tinyds", "tinyds-eagle3", 2),
    "qwen35": (
        widen_hybrid_zoo,
        QWEN35_TINY,
        QWEN35_TINY_DRAFT,
        "tinyqwen35",
        "tinyqwen35-eagle3",
        2,
    ),
    "gemma": (widen_gemma_zoo, GEMMA_TINY, GEMMA_TINY_DRAFT, "tinygemma", "tinygemma-eagle3", 0),
}
TOKENS = {"gemma": 150}  # past tinygemma's sliding window of 128


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("families"), {}

    def get(family: str) -> dict[str, Path]:
        if family not in cache:
            widen, shape, draft = FAMILIES[family][:3]
            cache[family] = widen(ZOO, root / family, shape, draft, torch.float32)
        return cache[family]

    return get


def _stream(family: str) -> Stream:
    """The widening's stream scales, as the family module derives them."""
    small = json.loads((ZOO / FAMILIES[family][3] / "config.json").read_text())
    big = FAMILIES[family][1]
    return Stream(
        small["hidden_size"], big.hidden, eps_factor(small, big) if family == "qwen35" else 1.0
    )


def _forward(model, ids: torch.Tensor):
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, len(ids))):
        return model(ids, torch.arange(len(ids)))


def _ids(n: int) -> torch.Tensor:
    return torch.randint(0, 4096, (n,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_target_logits_and_stream(widened, family):
    small = load_model(ZOO / FAMILIES[family][3], torch.float32, progress=False)
    big = load_model(widened(family)[FAMILIES[family][3]], torch.float32, progress=False)
    assert big.config.num_hidden_layers == FAMILIES[family][1].layers
    ids, st = _ids(TOKENS.get(family, 40)), _stream(family)
    h, hb = _forward(small, ids).hidden_states, _forward(big, ids).hidden_states
    assert hb[:, st.hidden_s :].abs().max() == 0, "padded hidden dims must stay exactly zero"
    torch.testing.assert_close(hb[:, : st.hidden_s], st.t * h, atol=1e-4 * st.t, rtol=1e-4)
    with torch.no_grad():
        logits, logits_b = small.compute_logits(h), big.compute_logits(hb)
    torch.testing.assert_close(logits_b, logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(logits_b.argmax(-1), logits.argmax(-1))


@pytest.mark.parametrize("family", ["deepseek", "qwen35"])
def test_mtp_layers_logits(widened, family):
    """Both chained MTP layers: the first over the target's state, the second over the first's output."""
    small = load_model(ZOO / FAMILIES[family][3], torch.float32, progress=False)
    big = load_model(widened(family)[FAMILIES[family][3]], torch.float32, progress=False)
    ids = _ids(48)
    states = [_forward(m, ids).hidden_states for m in (small, big)]
    logits = [[], []]
    for k in range(FAMILIES[family][5]):
        n = len(ids) - 1 - k
        for i, model in enumerate((small, big)):
            layer = model.mtp_layers[k]
            with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
                hidden = layer.target_state(model, states[i][:n]) if k == 0 else states[i][:n]
                states[i] = layer(torch.arange(n), ids[k + 1 :], hidden, model)
                logits[i].append(layer.compute_logits(model, states[i]))
    for small_logits, big_logits in zip(*logits):
        torch.testing.assert_close(big_logits, small_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_eagle3_draft_logits(widened, family):
    """The draft over the target's captured states, then over its own output (a chained step)."""
    out = []
    for target_dir, draft_dir in (
        (ZOO / FAMILIES[family][3], ZOO / FAMILIES[family][4]),
        tuple(widened(family)[FAMILIES[family][k]] for k in (3, 4)),
    ):
        target = load_model(target_dir, torch.float32, progress=False)
        draft = load_eagle3_draft(draft_dir, target, torch.float32, "cpu")
        draft.attach_target(target)
        target.set_aux_hidden_state_layers(target_capture_ids(draft.config, target))
        ids, n = _ids(40), 39
        aux = _forward(target, ids).aux_hidden_states
        with torch.no_grad(), forward_context(DenseCausalMetadata(1, n)):
            g = draft(ids[1:], torch.arange(n), draft.fuse_aux(aux[:n]))
            g2 = draft(ids[1:], torch.arange(n), g)
            out.append([draft.compute_logits(g), draft.compute_logits(g2)])
    for small_logits, big_logits in zip(*out):
        torch.testing.assert_close(big_logits, small_logits, atol=1e-4, rtol=1e-4)
        assert torch.equal(big_logits.argmax(-1), small_logits.argmax(-1))


def _generate(target: Path, spec: SpeculativeConfig | None = None):
    kwargs = {"speculative": spec} if spec else {}
    llm = LLM(str(target), device="cpu", dtype="float32", num_kv_blocks=64, **kwargs)
    outs = llm.generate(PROMPTS, GREEDY)
    return [o.token_ids for o in outs], _tau(outs)


def _tau(outs) -> float | None:
    """Tokens a verify (accepted drafts + 1) over ``outs``; None without a verify (plain decoding)."""
    verifies = sum(o.spec_metrics.num_verifies for o in outs)
    accepted = sum(o.spec_metrics.num_accepted_drafts for o in outs)
    return (accepted + verifies) / verifies if verifies else None


@pytest.mark.parametrize(
    "family,method",
    [
        ("deepseek", "mtp"),
        ("deepseek", "eagle3"),
        ("qwen35", "mtp"),
        ("qwen35", "tree"),
        ("gemma", "eagle3"),
    ],
)
def test_engine_tokens_and_acceptance(widened, family, method):
    """Through the engine (paged caches, recurrent states, verify): the zoo pair's tokens and tau. Measured:
    tau equal for every case (a wrong map drops it towards 1)."""
    name, draft = FAMILIES[family][3:5]

    def spec(d: Path) -> SpeculativeConfig:
        if method == "mtp":
            return SpeculativeConfig("mtp", num_steps=FAMILIES[family][5])
        if method == "tree":
            return SpeculativeConfig("eagle3", str(d), num_steps=3, topk=2, num_draft_tokens=6)
        return SpeculativeConfig("eagle3", str(d), num_steps=4)

    tokens, tau = _generate(ZOO / name, spec(ZOO / draft))
    wide_tokens, wide_tau = _generate(widened(family)[name], spec(widened(family)[draft]))
    assert wide_tokens == tokens == _generate(ZOO / name)[0]
    assert tau > 1.2 and wide_tau == pytest.approx(tau, abs=0.1)


def test_e2e_tiny_end_to_end(tmp_path):
    """``bench e2e --family qwen35 --tiny``: the widening, every method, the table and the JSON. Adaptive
    speculation picks each step's drafts from timings, so on a busy CPU a row may draft nothing: its
    acceptance is checked where the shapes are fixed (``test_engine_tokens_and_acceptance``)."""
    result = run_e2e_bench(
        tmp_path / "out", tmp_path / "work", ["none", "mtp"], 4, family="qwen35", tiny=True
    )
    rows = json.loads((tmp_path / "out" / "e2e_bench_qwen35.json").read_text())["rows"]
    assert {(r["method"], r["batch"], r["temperature"]) for r in rows} == {
        (m, b, t) for m in ("none", "mtp") for b in (1, 2) for t in (0.0, 0.8)
    }
    greedy = [r for r in result["rows"] if r["temperature"] == 0]
    assert all(r["match_zoo_greedy"] == 1.0 and r["match_plain_greedy"] == 1.0 for r in greedy)
    # plain decoding's step profiled as the drafters' start-up profiles theirs (the CPU: wall time)
    assert all(r["profiled_step_ms"] > 0 for r in result["rows"] if r["method"] == "none")
    for r in (r for r in result["rows"] if r["method"] == "mtp"):
        by_drafts = r["verifies_by_num_drafts"]  # verifies with 0, 1, .. drafts
        steps = E2E_FAMILIES["qwen35"].mtp_steps  # past tinyqwen35's 2 layers the last goes on
        assert r["tau"] >= 1 and sum(by_drafts) > 0 and len(by_drafts) <= 1 + steps


def test_e2e_batch_sizes_are_honoured_or_refused_by_name(tmp_path):
    """``--batch-sizes`` narrows bench e2e's batches and is refused by the benches that do not read it."""
    from outpace.cli import main

    with pytest.raises(ValueError, match="--batch-sizes"):
        run_e2e_bench(tmp_path / "out", tmp_path / "work", ["none"], 4, tiny=True, batches=[0])
    with pytest.raises(SystemExit, match="--batch-sizes applies to bench speed and e2e"):
        main(["bench", "gpu", "--batch-sizes", "4"])
    result = run_e2e_bench(
        tmp_path / "out", tmp_path / "work", ["none"], 2, family="qwen35", tiny=True, batches=[2]
    )
    assert {r["batch"] for r in result["rows"]} == {2}


def test_expert_copies_and_heads():
    """The routing layout: m copies of each zoo expert, copy c of group g in big group c * G_s + g; kv head
    copies when the big group is smaller; refusals."""
    cfg = json.loads(
        (ZOO / "tinyds" / "config.json").read_text()
    )  # 8 experts, 4 groups, top 2 of 2 groups
    layout = expert_layout(cfg, DS_TINY)  # 24 experts, top 4: 2 copies, 8 groups of 3
    assert (layout.groups, layout.top_groups) == (8, 4)
    assert layout.copies[3] == [4, 16]  # group 1 slot 1 -> slot 1 of groups 1 and 5
    with pytest.raises(ValueError, match="multiple"):
        expert_layout(cfg, DS_TINY.__class__(**{**vars(DS_TINY), "top_k": 5}))
    heads = gqa_heads(4, 1, 16, 8)  # tinygemma into Gemma-3-12B: each kv head copied twice
    assert heads.kv == [(0, 0), (0, 1)] and heads.q == [(0, 0), (1, 1), (2, 2), (3, 3)]
    with pytest.raises(ValueError, match="cannot place"):
        gqa_heads(4, 4, 6, 3)


def test_wrong_rope_map_is_caught(tmp_path, monkeypatch):
    """Head dims padded in place (dim i -> i) pair the wrong dims under RoPE: the logits differ grossly."""
    monkeypatch.setattr(
        widen_families, "halves_dims", lambda d_s, d_b, rot_s=None, rot_b=None: torch.arange(d_s)
    )
    import outpace.bench.widen_gemma as gemma

    monkeypatch.setattr(gemma, "halves_dims", widen_families.halves_dims)
    dirs = widen_gemma_zoo(ZOO, tmp_path, GEMMA_TINY, GEMMA_TINY_DRAFT, torch.float32)
    small = load_model(ZOO / "tinygemma", torch.float32, progress=False)
    big = load_model(dirs["tinygemma"], torch.float32, progress=False)
    ids = _ids(64)
    with torch.no_grad():
        logits = small.compute_logits(_forward(small, ids).hidden_states)
        logits_b = big.compute_logits(_forward(big, ids).hidden_states)
    assert (logits_b - logits).abs().max() > 1e-2 * logits.abs().max()


# A bf16 run may pick another greedy token only where the float32 zoo target's top logits lie this close (a share of
# the top one): tinygemma's first token after two of the first three eval prompts is such a tie, 7.970 against 7.950
# and 10.208 against 10.193, which bf16 rounds to one value (the argmax then takes the lower id)
NEAR_TIE = 0.02
BF16_PROMPTS = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:8]


def _part_at_a_near_tie(zoo, prompt_ids: list[int], tokens: list[int], other: list[int]) -> bool:
    """Whether two greedy runs' tokens are equal, or equal up to a position where the float32 zoo target ``zoo`` puts
    both runs' tokens within ``NEAR_TIE`` of its top logit (after the prompt and the tokens they share)."""
    first = next((i for i, (a, b) in enumerate(zip(tokens, other)) if a != b), None)
    if first is None:
        return len(tokens) == len(other)
    ids = torch.tensor(prompt_ids + tokens[:first])
    with torch.no_grad():
        logits = zoo.compute_logits(_forward(zoo, ids).hidden_states[-1:])[0]
    top = logits.max()
    return all(top - logits[t] <= NEAR_TIE * top.abs() for t in (tokens[first], other[first]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_bf16_widened_keeps_tokens_and_acceptance(tmp_path, family, device):
    """In bf16 (what bench e2e runs on the GPU), at the tiny widening: the widened weights are the zoo's re-rounded
    once (irrational scales), so greedy tokens may part only at near ties of the zoo's float32 logits
    (``_part_at_a_near_tie``), and over the prompts whose tokens stay equal (one at least of 8) the acceptance
    stays close."""
    widen, shape, draft, name, draft_name, mtp = FAMILIES[family]
    dirs = widen(ZOO, tmp_path, shape, draft, torch.bfloat16)
    spec = lambda d: (
        SpeculativeConfig("mtp", num_steps=mtp)
        if mtp
        else SpeculativeConfig("eagle3", str(d), num_steps=4)
    )  # noqa: E731
    runs = []
    for target, d in ((ZOO / name, ZOO / draft_name), (dirs[name], dirs[draft_name])):
        llm = LLM(str(target), device=device, dtype="bfloat16", speculative=spec(d))
        runs.append(llm.generate(BF16_PROMPTS, GREEDY))
        del llm
    zoo = load_model(ZOO / name, torch.float32, progress=False)
    for a, b in zip(*runs):
        assert _part_at_a_near_tie(zoo, a.prompt_token_ids, a.token_ids, b.token_ids), (
            a.prompt_token_ids
        )
    equal = [(a, b) for a, b in zip(*runs) if a.token_ids == b.token_ids]
    assert equal
    assert _tau([b for _, b in equal]) == pytest.approx(_tau([a for a, _ in equal]), abs=0.3)


@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "triton"])
def test_v2_lite_routing_layout_routes_as_the_zoo(kernel):
    """At the real shape (64 experts, 16 groups of 4, 6 of 6 groups, top 6: 3 copies of each zoo expert and
    padding experts), torch routing and the routing kernel (layers/moe_routing_kernel.py, interpreted on the
    CPU) choose the copies of the zoo's experts, whose weights sum to the zoo's per expert."""
    cfg = json.loads((ZOO / "tinyds" / "config.json").read_text())
    small = load_file(str(ZOO / "tinyds" / "model.safetensors"))
    w = DeepseekWidening(cfg, small, V2_LITE, torch.float32)
    prefix = "model.layers.1.mlp.gate."
    for name in (prefix + "weight", prefix + "e_score_correction_bias"):
        w.tensor(name)
    big = {n: build() for n, _, _, build in w.plan.entries}
    lay = w.layout

    def router(experts, top_k, groups, top_groups, hidden, weight, bias) -> Router:
        r = Router(
            hidden, Routing(experts, top_k, "sigmoid", groups, top_groups, "top2_sum", True, True)
        )
        r.weight.data, r.e_score_correction_bias = weight.float(), bias.float()
        return r

    zoo = router(
        8, 2, 4, 2, 64, small[prefix + "weight"], small[prefix + "e_score_correction_bias"]
    )
    wide = router(
        64,
        6,
        lay.groups,
        lay.top_groups,
        2048,
        big[prefix + "weight"],
        big[prefix + "e_score_correction_bias"],
    )
    wide.kernel = kernel
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(2))
    xb = torch.zeros(37, 2048)
    xb[:, :64] = x * w.st.s  # the input norm's output at scale s
    weights, ids = zoo.reference(x)
    wide_weights, wide_ids = wide(xb)
    back = {b: e for e, copies in lay.copies.items() for b in copies}  # a padding expert: KeyError
    summed = torch.zeros(37, 8)  # [tokens, zoo experts]
    for t in range(37):
        for weight, i in zip(wide_weights[t].tolist(), wide_ids[t].tolist()):
            summed[t, back[i]] += weight
    expected = torch.zeros(37, 8).scatter_(1, ids, weights)
    torch.testing.assert_close(summed, expected, atol=1e-5, rtol=1e-5)
