"""The Triton recurrences of gated DeltaNet and Mamba2 (layers/recurrent_kernels.py; in Triton's interpreter
here, compiled on a GPU) against the torch loops of layers/gated_deltanet.py and layers/mamba2.py: prefill
runs of mixed lengths (padding leaves the state alone), verify chains keeping the state after every token,
and draft trees whose nodes continue their parents' states; grouped key / B-C heads, odd head sizes. On a
GPU also: the kernels inside a captured CUDA graph, and Qwen3-Next / Nemotron-H generating the CPU's
greedy tokens in fp32 (speculative tree included)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from outpace.layers.gated_deltanet import gated_delta_rule_run  # noqa: E402
from outpace.layers.mamba2 import ssm_run  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else the interpreter
RUNS, LENGTH = 3, 6


def runs_and_trees(seed):
    """(valid [RUNS, LENGTH]: runs of 6, 2 and 4 tokens; parents [RUNS, LENGTH] of three different trees)."""
    valid = torch.arange(LENGTH) < torch.tensor([6, 2, 4])[:, None]
    parents = torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 3, 3]])
    return valid.to(DEVICE), parents.to(DEVICE)


def delta_inputs(seed, k_heads=2, v_heads=4, dk=8, dv=6):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    q, k = r(RUNS, LENGTH, k_heads, dk), r(RUNS, LENGTH, k_heads, dk)
    v = r(RUNS, LENGTH, v_heads, dv)
    gate = -torch.rand(RUNS, LENGTH, v_heads, generator=g)  # log decay <= 0
    beta = torch.rand(RUNS, LENGTH, v_heads, generator=g)
    state = r(RUNS, v_heads, dk, dv)
    return [t.to(DEVICE) for t in (q, k, v, gate, beta, state)]


def ssm_inputs(seed, heads=6, groups=2, p=5, n=7):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    x, dt = r(RUNS, LENGTH, heads, p), torch.rand(RUNS, LENGTH, heads, generator=g) * 0.5 + 0.01
    A, B, C, D = (
        -torch.rand(heads, generator=g),
        r(RUNS, LENGTH, groups, n),
        r(RUNS, LENGTH, groups, n),
        r(heads),
    )
    state = r(RUNS, heads, p, n)
    return [t.to(DEVICE) for t in (x, dt, A, B, C, D, state)]


def assert_same(kernel_out, torch_out):
    for got, want in zip(kernel_out, torch_out):
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form", ["prefill", "verify chain", "tree"])
@pytest.mark.parametrize("shape", [dict(), dict(k_heads=1, v_heads=3, dk=5, dv=40)])
def test_delta_rule_kernel_matches_the_torch_loop(form, shape):
    valid, parents = runs_and_trees(0)
    inputs = delta_inputs(1, **shape)
    if form != "prefill":
        valid = torch.ones_like(valid)
    args = (valid, parents if form == "tree" else None, form != "prefill")
    torch_out = gated_delta_rule_run(*inputs, *args, kernel=False)
    assert_same(gated_delta_rule_run(*inputs, *args, kernel=True), torch_out)
    if form == "tree":  # the parents matter: as a chain the same tokens give other outputs
        chain = gated_delta_rule_run(*inputs, valid, None, True, kernel=True)
        assert not torch.allclose(chain[0], torch_out[0], atol=1e-3)


@pytest.mark.parametrize("form", ["prefill", "verify chain", "tree"])
@pytest.mark.parametrize("shape", [dict(), dict(heads=4, groups=1, p=33, n=16)])
def test_ssm_kernel_matches_the_torch_loop(form, shape):
    valid, parents = runs_and_trees(0)
    inputs = ssm_inputs(2, **shape)
    if form != "prefill":
        valid = torch.ones_like(valid)
    args = (valid, parents if form == "tree" else None, form != "prefill")
    torch_out = ssm_run(*inputs, *args, kernel=False)
    assert_same(ssm_run(*inputs, *args, kernel=True), torch_out)
    if form == "tree":
        chain = ssm_run(*inputs, valid, None, True, kernel=True)
        assert not torch.allclose(chain[0], torch_out[0], atol=1e-3)


def test_padding_leaves_the_kernel_state_alone():
    """A run's final state is the state after its last valid token, whatever its padding holds."""
    valid, _ = runs_and_trees(0)
    q, k, v, gate, beta, state = delta_inputs(3)
    _, final, _ = gated_delta_rule_run(q, k, v, gate, beta, state, valid, None, False, kernel=True)
    noisy = [t.clone() for t in (q, k, v)]
    for t in noisy:
        t[~valid] = 7.0
    _, final_noisy, _ = gated_delta_rule_run(
        *noisy, gate, beta, state, valid, None, False, kernel=True
    )
    torch.testing.assert_close(final_noisy, final, rtol=0, atol=0)


def test_kernels_take_strided_states_and_inputs():
    """The state a layer hands over may be a strided view (a transposed layout here), and so may its inputs:
    outputs and final states must still come back right (both used to be written as if contiguous into
    tensors laid out like the views)."""
    valid, _ = runs_and_trees(0)
    q, k, v, gate, beta, state = delta_inputs(4)
    state_delta = state
    strided = state.transpose(2, 3).contiguous().transpose(2, 3)  # same values, other strides
    args = (valid, None, False)
    assert_same(
        gated_delta_rule_run(q, k, v, gate, beta, strided, *args, kernel=True),
        gated_delta_rule_run(q, k, v, gate, beta, state, *args, kernel=False),
    )
    *rest, state = ssm_inputs(5)
    strided = state.transpose(2, 3).contiguous().transpose(2, 3)
    assert_same(
        ssm_run(*rest, strided, *args, kernel=True), ssm_run(*rest, state, *args, kernel=False)
    )
    # inputs laid out channel-major, as a convolution's output is (empty_like would keep that layout for y)
    x, dt, A, B, C, D = rest
    permuted = [t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) for t in (x, B, C)]
    assert_same(
        ssm_run(permuted[0], dt, A, permuted[1], permuted[2], D, state, *args, kernel=True),
        ssm_run(x, dt, A, B, C, D, state, *args, kernel=False),
    )
    v_permuted = v.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    assert_same(
        gated_delta_rule_run(q, k, v_permuted, gate, beta, state_delta, *args, kernel=True),
        gated_delta_rule_run(q, k, v, gate, beta, state_delta, *args, kernel=False),
    )


# ---- GPU only ------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_kernels_replay_inside_a_cuda_graph():
    valid, parents = runs_and_trees(0)
    delta, ssm = delta_inputs(4), ssm_inputs(5)
    eager = (
        gated_delta_rule_run(*delta, valid, parents, True),
        ssm_run(*ssm, valid, parents, True),
    )
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # warm-up (compilation) outside the capture
        gated_delta_rule_run(*delta, valid, parents, True), ssm_run(*ssm, valid, parents, True)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = (
            gated_delta_rule_run(*delta, valid, parents, True),
            ssm_run(*ssm, valid, parents, True),
        )
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(captured, eager):
        assert_same(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
def test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus(variant, tmp_path):
    """fp32 on the GPU (kernels in the captured decode steps, chunked prefill) gives the CPU's greedy tokens:
    plain, with the hybrid as its own (recurrent) draft, and with an EAGLE3 tree."""
    from helpers.hybrid_models import make_hybrid, save_hybrid
    from helpers.spec_models import make_eagle3_draft
    from outpace import LLM, SamplingParams
    from outpace.config import SpeculativeConfig

    path = save_hybrid(make_hybrid(variant), tmp_path / variant)
    eagle3 = make_eagle3_draft(path, tmp_path / "eagle3")
    prompts = [[3, 17, 99, 100, 8, 42, 7], [5, 9], [(i * 7) % 131 for i in range(40)]]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    cpu = [
        o.token_ids for o in LLM(str(path), device="cpu", block_size=4).generate(prompts, params)
    ]
    for spec in (
        SpeculativeConfig(),
        SpeculativeConfig("draft", str(path), num_steps=3),
        SpeculativeConfig("eagle3", str(eagle3), num_steps=3, topk=2, num_draft_tokens=6),
    ):
        gpu = LLM(
            str(path),
            device="cuda",
            dtype="float32",
            block_size=16,
            max_num_batched_tokens=16,
            speculative=spec,
        ).generate(prompts, params)
        assert [o.token_ids for o in gpu] == cpu, spec


@pytest.mark.gpu
@pytest.mark.parametrize("lengths", [(300, 70, 129), (64, 64, 64)])
def test_chunked_prefill_kernels_match_the_per_token_kernels(lengths):
    """Long prefill runs take flash-linear-attention's chunked kernels (layers/chunked_scans.py): the same
    outputs and final states as the per-token kernels, padding included, to TF32 precision (the chunked
    form's matrix products take float32 inputs as TF32: single elements differ by up to ~3e-2 at unit
    scale, so the bound is on the relative error of the whole tensor). NaN at every input of the padding
    positions (what a captured prefill's padding rows may hold) changes no bit of the valid outputs or the
    states."""

    def assert_near(got, want):
        assert ((got - want).norm() / want.norm()).item() < 5e-3

    def nan_padding(*tensors):  # each [runs, length, ...]
        return [
            t.masked_fill(~valid.view(*valid.shape, *[1] * (t.dim() - 2)), float("nan"))
            for t in tensors
        ]

    pytest.importorskip("fla")
    from outpace.layers.chunked_scans import use_chunked

    g = torch.Generator().manual_seed(7)
    r = lambda *s: torch.randn(*s, generator=g).cuda()  # noqa: E731
    runs, length = len(lengths), max(lengths)
    valid = torch.arange(length).cuda() < torch.tensor(lengths).cuda()[:, None]
    assert use_chunked(valid.float(), length, None, False)
    q, k, v = r(runs, length, 2, 64), r(runs, length, 2, 64), r(runs, length, 4, 48)
    gate = -torch.rand(runs, length, 4, generator=g).cuda() * 0.2
    beta = torch.rand(runs, length, 4, generator=g).cuda()
    state = r(runs, 4, 64, 48) * 0.1
    chunked = gated_delta_rule_run(q, k, v, gate, beta, state, valid, None, False)
    per_token = gated_delta_rule_run(q, k, v, gate, beta, state, valid, None, False, kernel=True)
    assert_near(chunked[0][valid], per_token[0][valid])  # outputs [valid, ...]
    assert_near(chunked[1], per_token[1])  # final states
    poisoned = gated_delta_rule_run(*nan_padding(q, k, v, gate, beta), state, valid, None, False)
    assert torch.equal(poisoned[0][valid], chunked[0][valid]) and torch.equal(
        poisoned[1], chunked[1]
    )
    x, dt = r(runs, length, 8, 32), torch.rand(runs, length, 8, generator=g).cuda() * 0.2 + 0.01
    A, B, C, D = (
        -torch.rand(8, generator=g).cuda(),
        r(runs, length, 2, 64),
        r(runs, length, 2, 64),
        r(8),
    )
    state = r(runs, 8, 32, 64) * 0.1
    chunked = ssm_run(x, dt, A, B, C, D, state, valid, None, False)
    per_token = ssm_run(x, dt, A, B, C, D, state, valid, None, False, kernel=True)
    assert_near(chunked[0][valid], per_token[0][valid])
    assert_near(chunked[1], per_token[1])
    x, dt, B, C = nan_padding(x, dt, B, C)
    poisoned = ssm_run(x, dt, A, B, C, D, state, valid, None, False)
    assert torch.equal(poisoned[0][valid], chunked[0][valid]) and torch.equal(
        poisoned[1], chunked[1]
    )


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["qwen3_next", "nemotron_h"])
def test_hybrid_long_prompts_through_chunked_prefill_keep_the_cpus_tokens(variant, tmp_path):
    """Prompts of hundreds of tokens prefilled in chunks of 128 (so through the chunked kernels, the state
    carried across chunk edges) give the CPU's greedy tokens, plain and with an EAGLE3 chain."""
    pytest.importorskip("fla")
    from helpers.hybrid_models import make_hybrid, save_hybrid
    from helpers.spec_models import make_eagle3_draft
    from outpace import LLM, SamplingParams
    from outpace.config import SpeculativeConfig

    path = save_hybrid(make_hybrid(variant), tmp_path / variant)
    eagle3 = make_eagle3_draft(path, tmp_path / "eagle3")
    prompts = [
        [(i * 7 + 3) % 131 for i in range(300)],
        [(i * 11) % 97 + 1 for i in range(150)],
        [5, 9, 4],
    ]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    cpu = [
        o.token_ids for o in LLM(str(path), device="cpu", block_size=16).generate(prompts, params)
    ]
    for spec in (SpeculativeConfig(), SpeculativeConfig("eagle3", str(eagle3), num_steps=3)):
        gpu = LLM(
            str(path),
            device="cuda",
            dtype="float32",
            block_size=16,
            max_num_batched_tokens=128,
            speculative=spec,
        ).generate(prompts, params)
        assert [o.token_ids for o in gpu] == cpu, spec
