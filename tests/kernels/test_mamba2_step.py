"""Mamba2's fused few-row step (layers/mamba2_step_kernel.py; Triton's interpreter here, compiled on a GPU)
against the mixer's eager path (layers/mamba2.py): the layer's output, the state rows and the verify
snapshots, for decode (mixed run lengths: padding leaves the state alone), verify chains of 2..8 tokens,
draft trees whose nodes continue their parents' states, runs with and without an initial state, odd head
counts and sizes, one and two groups. On a GPU also: bf16 at Nemotron-H-8B's shape, the step inside a
captured CUDA graph, and its time against the eager path's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from helpers.kernel_checks import record_launches  # noqa: E402
from outpace.attention import build_paged_metadata, forward_context  # noqa: E402
from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers import mamba2_step_kernel  # noqa: E402
from outpace.layers.mamba2 import Mamba2Mixer  # noqa: E402
from outpace.layers.recurrent import RecurrentMetadata  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else the interpreter
SLOTS, SNAPSHOT_ROWS = 5, 8
# (heads, head_dim, groups, state_size, conv_width): odd sizes, one and two groups, a head of two blocks
SHAPES = {
    "odd": (6, 5, 2, 7, 4),
    "one group, long heads": (3, 40, 1, 16, 3),
}
# Nemotron-H-8B (huggingface.co/nvidia/Nemotron-H-8B-Base-8K config.json): hidden_size 4096,
# mamba_num_heads 128, mamba_head_dim 64, n_groups 8, ssm_state_size 128, conv_kernel 4,
# use_conv_bias, time_step_min 0.001, layer_norm_epsilon 1e-5
NEMOTRON_H_8B = dict(hidden=4096, heads=128, head_dim=64, groups=8, state_size=128, width=4)


def make_mixer(heads, head_dim, groups, state_size, width, hidden=24, dtype=torch.float32, seed=0):
    """A mixer with random weights of trained-like scale and random state rows and snapshots."""
    g = torch.Generator().manual_seed(seed)
    mixer = Mamba2Mixer(
        hidden, heads, head_dim, groups, state_size, width, True, False, "silu", 1e-3, 1e-5
    )
    with torch.no_grad():
        for p in mixer.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 1))
        mixer.A_log.copy_(torch.rand(heads, generator=g) * 2 - 1)
        mixer.dt_bias.copy_(torch.rand(heads, generator=g) * 2 - 3)
    mixer = mixer.to(DEVICE, dtype)
    states, snapshots = {}, {}
    for name, (shape, declared) in mixer.state_shapes().items():
        kind = dict(dtype=declared or dtype, device=DEVICE)
        states[name] = torch.randn(SLOTS, *shape, generator=g).to(**kind)
        snapshots[name] = torch.randn(SLOTS, SNAPSHOT_ROWS, *shape, generator=g).to(**kind)
    mixer.bind_state(states, snapshots)
    return mixer


def run_step(mixer, fused, x, query_lens, recurrent):
    """The mixer over one forward with its own copy of the state -> (output, states, snapshots)."""
    states = {k: v.clone() for k, v in mixer.states.items()}
    snapshots = {k: v.clone() for k, v in mixer.snapshots.items()}
    saved = mixer.states, mixer.snapshots
    mixer.bind_state(states, snapshots)
    mixer.fused = fused
    meta = build_paged_metadata(
        [[0]] * len(query_lens), [0] * len(query_lens), query_lens, 16, DEVICE
    )
    try:
        with torch.no_grad(), forward_context(meta, recurrent=recurrent):
            assert mixer.takes_fused_step(x) == fused
            out = mixer(x)
    finally:
        mixer.bind_state(*saved)
    return out, states, snapshots


def recurrent_metadata(indices, has_initial, parents=None, snapshots=False):
    return RecurrentMetadata(
        torch.tensor(indices, device=DEVICE),
        torch.tensor(has_initial, device=DEVICE),
        None if parents is None else torch.tensor(parents, device=DEVICE),
        snapshots,
    )


def assert_step_matches_eager(mixer, query_lens, recurrent, tol=1e-5, seed=1):
    """The fused step's output, state rows and (valid positions') snapshots equal the eager path's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(query_lens), mixer.in_proj.weight.shape[1], generator=g)
    x = x.to(DEVICE, mixer.in_proj.weight.dtype)
    want, want_states, want_snaps = run_step(mixer, False, x, query_lens, recurrent)
    got, got_states, got_snaps = run_step(mixer, True, x, query_lens, recurrent)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    for name in want_states:
        torch.testing.assert_close(got_states[name], want_states[name], rtol=tol, atol=tol)
        for slot, n in zip(recurrent.state_indices.tolist(), query_lens):
            if recurrent.snapshots:  # padding positions' snapshots are never committed
                want_rows, got_rows = want_snaps[name][slot, :n], got_snaps[name][slot, :n]
                torch.testing.assert_close(got_rows, want_rows, rtol=tol, atol=tol)
    return got


@pytest.mark.parametrize(
    "shape, lengths", [("odd", [1, 1, 1]), ("odd", [2, 0, 4]), ("one group, long heads", [1, 3, 2])]
)
def test_decode_leaves_the_state_after_each_runs_last_token(shape, lengths):
    """Decode (one token per run) and short runs of mixed lengths (padding, an empty run) into the state
    rows; the middle run starts from zeros."""
    mixer = make_mixer(*SHAPES[shape])
    assert_step_matches_eager(mixer, lengths, recurrent_metadata([3, 0, 4], [True, False, True]))


def test_padding_rows_change_nothing_and_get_finite_outputs(monkeypatch):
    """A captured prefill pads its chunks to one length (RecurrentMetadata.run_lens), and a padding row holds
    what the layer before left there, NaN possibly: the valid outputs and the states equal those of zero padding
    rows, and the padding rows' outputs are finite (the kernel writes none there: its output starts at zeros),
    so the layers after the mixer read finite rows."""
    new_empty = torch.Tensor.new_empty  # memory no one wrote holds NaN here

    def nan_filled(self, *args, **kwargs):
        t = new_empty(self, *args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled)
    mixer = make_mixer(*SHAPES["odd"])
    run_lens = [2, 4, 1]
    recurrent = dataclasses.replace(
        recurrent_metadata([3, 0, 4], [True, False, True]),
        run_lens=torch.tensor(run_lens, device=DEVICE),
    )
    padding = torch.tensor([t >= n for n in run_lens for t in range(4)], device=DEVICE)
    x = torch.randn(12, mixer.in_proj.weight.shape[1], generator=torch.Generator().manual_seed(1))
    x = x.to(DEVICE)
    clean, poisoned = (
        run_step(mixer, True, x.masked_fill(padding[:, None], fill), [4, 4, 4], recurrent)
        for fill in (0.0, float("nan"))
    )
    torch.testing.assert_close(poisoned[0][~padding], clean[0][~padding], rtol=0, atol=0)
    assert poisoned[0][padding].isfinite().all()
    for name in clean[1]:
        torch.testing.assert_close(poisoned[1][name], clean[1][name], rtol=0, atol=0)


@pytest.mark.parametrize(
    "shape, width",
    [("odd", 2), ("odd", 8), ("one group, long heads", 3), ("one group, long heads", 5)],
)
def test_verify_chain_keeps_the_state_after_every_token(shape, width):
    mixer = make_mixer(*SHAPES[shape])
    recurrent = recurrent_metadata([4, 2], [True, False], snapshots=True)
    assert_step_matches_eager(mixer, [width] * 2, recurrent)


def test_verify_chain_of_mixed_lengths():
    mixer = make_mixer(*SHAPES["odd"])
    recurrent = recurrent_metadata([1, 4, 2], [True, False, True], snapshots=True)
    assert_step_matches_eager(mixer, [6, 2, 4], recurrent)


TREES = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 3, 3]]  # [runs, nodes]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_nodes_continue_their_parents(shape):
    mixer = make_mixer(*SHAPES[shape])
    assert_step_matches_eager(
        mixer, [6] * 3, recurrent_metadata([2, 0, 3], [True, False, True], TREES, snapshots=True)
    )


def test_tree_differs_from_the_chain_of_its_tokens():
    """The parents matter: read as chains, the same tokens give other outputs."""
    mixer = make_mixer(*SHAPES["odd"])
    x = torch.randn(6, 24, device=DEVICE)
    tree = recurrent_metadata([2], [True], TREES[:1], snapshots=True)
    chain = recurrent_metadata([2], [True], snapshots=True)
    as_tree, _, _ = run_step(mixer, True, x, [6], tree)
    as_chain, _, _ = run_step(mixer, True, x, [6], chain)
    assert not torch.allclose(as_tree[2:], as_chain[2:], atol=1e-3)
    torch.testing.assert_close(as_tree[:2], as_chain[:2])  # nodes 0 and 1 are a chain either way


def test_other_forwards_take_the_eager_path():
    """No recurrent metadata (references), prefill-length runs, unbound states: the eager path."""
    mixer = make_mixer(*SHAPES["odd"])
    x = torch.randn(20, 24, device=DEVICE)
    recurrent = recurrent_metadata([0], [True])
    mixer.fused = True
    long_meta = build_paged_metadata([[0]], [0], [20], 64, DEVICE)
    with forward_context(long_meta, recurrent=recurrent):
        assert not mixer.takes_fused_step(x)
    short_meta = build_paged_metadata([[0]], [0], [4], 16, DEVICE)
    with forward_context(short_meta):
        assert not mixer.takes_fused_step(x)
    with forward_context(short_meta, recurrent=recurrent):
        assert mixer.takes_fused_step(x)
        mixer.states = None
        assert not mixer.takes_fused_step(x)


# ---- GPU only ------------------------------------------------------------------------------------------------


def nemotron_h_8b_mixer():
    s = NEMOTRON_H_8B
    return make_mixer(
        s["heads"],
        s["head_dim"],
        s["groups"],
        s["state_size"],
        s["width"],
        s["hidden"],
        torch.bfloat16,
    )


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["decode", "verify chain", "tree"])
def test_bf16_at_nemotron_h_8b_shape_matches_the_eager_path(form):
    """bf16 in the model, float32 state: the fused step rounds where the eager path rounds, so the two
    differ only by the order of float32 sums (and the bf16 roundings that order flips)."""
    mixer = nemotron_h_8b_mixer()
    indices, initial = [3, 0, 4], [True, False, True]
    if form == "decode":
        lengths, recurrent = [1, 1, 1], recurrent_metadata(indices, initial)
    elif form == "verify chain":
        lengths, recurrent = [8, 8, 8], recurrent_metadata(indices, initial, snapshots=True)
    else:
        lengths, recurrent = [6] * 3, recurrent_metadata(indices, initial, TREES, snapshots=True)
    assert_step_matches_eager(mixer, lengths, recurrent, tol=2e-2)


@pytest.mark.gpu
def test_fused_step_replays_inside_a_cuda_graph():
    mixer = nemotron_h_8b_mixer()
    recurrent = recurrent_metadata([3, 0, 4], [True, False, True], TREES, snapshots=True)
    x = torch.randn(18, NEMOTRON_H_8B["hidden"], device=DEVICE, dtype=torch.bfloat16)
    meta = build_paged_metadata([[0]] * 3, [0] * 3, [6] * 3, 16, DEVICE)
    mixer.fused = True
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        eager = mixer(x)
        snapshots = {k: v.clone() for k, v in mixer.snapshots.items()}
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = mixer(x)
        graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, eager, rtol=0, atol=0)
    for name, snap in snapshots.items():
        torch.testing.assert_close(mixer.snapshots[name], snap, rtol=0, atol=0)


def step_time_us(mixer, fused, batch, width, repeats=50):
    """Mean µs of one layer's step (in_proj to out_proj) over ``batch`` runs of ``width`` tokens, replayed
    from a CUDA graph as the engine runs it."""
    lengths = [width] * batch
    recurrent = recurrent_metadata(list(range(batch)), [True] * batch, snapshots=width > 1)
    x = torch.randn(batch * width, NEMOTRON_H_8B["hidden"], device=DEVICE, dtype=torch.bfloat16)
    meta = build_paged_metadata([[0]] * batch, [0] * batch, lengths, 16, DEVICE)
    mixer.fused = fused
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        mixer(x)  # compile, warm the token table
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            mixer(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


@pytest.mark.gpu
@pytest.mark.parametrize("batch, width", [(1, 1), (8, 1), (32, 1), (1, 8), (8, 8), (8, 16)])
def test_fused_step_is_faster_than_the_eager_path(batch, width):
    """Prints both times (pytest -s); the fused step must not be slower."""
    s = NEMOTRON_H_8B
    g = torch.Generator().manual_seed(0)
    mixer = Mamba2Mixer(
        s["hidden"],
        s["heads"],
        s["head_dim"],
        s["groups"],
        s["state_size"],
        s["width"],
        True,
        False,
        "silu",
        1e-3,
        1e-5,
    ).to(DEVICE, torch.bfloat16)
    states, snapshots = {}, {}
    for name, (shape, declared) in mixer.state_shapes().items():
        kind = dict(dtype=declared or torch.bfloat16, device=DEVICE)
        states[name] = torch.randn(batch, *shape, generator=g).to(**kind)
        snapshots[name] = torch.zeros(batch, 16, *shape, **kind)
    mixer.bind_state(states, snapshots)
    eager, fused = step_time_us(mixer, False, batch, width), step_time_us(mixer, True, batch, width)
    print(
        f"\nNemotron-H-8B mamba step, {batch} x {width} tokens: eager {eager:.1f} µs, fused {fused:.1f} µs"
    )  # (a timing, printed for the benchmark notes: speed is never asserted in a test)


def decode_one_by_one(mixer, x, indices):
    """``len(x) // len(indices)`` decode steps of runs ``indices`` (step t: rows t * runs ..), each step's state
    committed into the rows before the next -> (outputs [steps, runs, inner], each step's state rows by name)."""
    runs, start = len(indices), {k: v.clone() for k, v in mixer.states.items()}
    outs, after = [], []
    for t in range(len(x) // runs):
        rows = x[t * runs : (t + 1) * runs]
        out, states, _ = run_step(
            mixer, True, rows, [1] * runs, recurrent_metadata(indices, [True] * runs)
        )
        for k in mixer.states:
            mixer.states[k].copy_(states[k])
        outs.append(out)
        after.append({k: v[indices[0]].clone() for k, v in states.items()})
    for k in mixer.states:  # (the pool as it was)
        mixer.states[k].copy_(start[k])
    return torch.stack(outs), after


@pytest.mark.parametrize("shape", ["odd", "nemotron-h-8b"] if DEVICE == "cuda" else ["odd"])
def test_batch_invariant_mode_gives_a_token_its_bits_in_every_launch(shape):
    """Batch-invariant mode's premise for Mamba2 on the compiled kernels: one run's 3 tokens decoded one at a
    time into its row, alone and beside three other runs, and verified as one chain (snapshots), give the same
    outputs and the same float32 state after each token, bit for bit (the gated DeltaNet step's twin test found
    its run-length compilations apart: tests/kernels/test_deltanet_step.py)."""
    mixer = nemotron_h_8b_mixer() if shape == "nemotron-h-8b" else make_mixer(*SHAPES[shape])
    hidden = mixer.in_proj.weight.shape[1]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, hidden, generator=g).to(DEVICE, mixer.in_proj.weight.dtype)
    ours, others = x[:3], x[3:].view(3, 3, hidden)  # the run's tokens; three other runs' three each
    with forward_settings(True):
        alone, alone_states = decode_one_by_one(mixer, ours, [3])
        # step t: ours, then the others'
        beside = torch.cat([ours[:, None], others], dim=1).reshape(12, hidden)
        batched, batched_states = decode_one_by_one(mixer, beside, [3, 0, 4, 1])
        chain, _, kept = run_step(
            mixer, True, ours, [3], recurrent_metadata([3], [True], snapshots=True)
        )
    assert torch.equal(batched[:, 0], alone[:, 0])
    assert torch.equal(chain, alone[:, 0])
    for t in range(3):
        for k in alone_states[t]:
            assert torch.equal(batched_states[t][k], alone_states[t][k]), (t, k)
            assert torch.equal(kept[k][3, t], alone_states[t][k]), (t, k)


@pytest.mark.parametrize("shape", ["odd", "nemotron-h-8b"] if DEVICE == "cuda" else ["odd"])
def test_batch_invariant_mode_gives_a_tree_node_its_paths_bits(shape):
    """A draft tree's node 3 (parents -1, 0, 0, 1: its path 0, 1, 3) gets, with its ancestors, the outputs and
    float32 states that decoding the path's tokens one at a time into the row gives (compiled for a tree, the
    gated DeltaNet step's nodes took other last bits on the H200: gpu_2026-12-03e call 1)."""
    mixer = nemotron_h_8b_mixer() if shape == "nemotron-h-8b" else make_mixer(*SHAPES[shape])
    hidden = mixer.in_proj.weight.shape[1]
    x = torch.randn(4, hidden, generator=torch.Generator().manual_seed(3))
    x = x.to(DEVICE, mixer.in_proj.weight.dtype)
    path = [0, 1, 3]
    with forward_settings(True):
        decoded, decoded_states = decode_one_by_one(mixer, x[path], [3])
        meta = recurrent_metadata([3], [True], parents=[[-1, 0, 0, 1]], snapshots=True)
        tree, _, kept = run_step(mixer, True, x, [4], meta)
    for i, node in enumerate(path):
        assert torch.equal(tree[node], decoded[i, 0]), node
        for k in decoded_states[i]:
            assert torch.equal(kept[k][3, node], decoded_states[i][k]), (node, k)


def test_batch_invariant_mode_launches_one_compilation_for_every_batch_and_run(monkeypatch):
    """In the mode a decode of 1 and of 3 runs, a verified chain and a tree launch the kernels whose run length,
    snapshot rows and form Triton does not specialise, over a state block sized for one run; outside it the batch
    sizes the block (more programs for few runs) and the plain kernels launch."""
    launches, blocks = [], []
    for name in ("_scan_kernel", "_norm_kernel", "_scan_any_length", "_norm_any_length"):
        record_launches(monkeypatch, mamba2_step_kernel, name, launches)
    real_block = mamba2_step_kernel._head_block
    monkeypatch.setattr(
        mamba2_step_kernel,
        "_head_block",
        lambda p, programs, device: blocks.append(programs) or real_block(p, programs, device),
    )
    mixer = make_mixer(*SHAPES["odd"])
    x = torch.randn(3, 24, device=DEVICE)
    forms = [
        ([1], recurrent_metadata([3], [True])),
        ([1, 1, 1], recurrent_metadata([3, 0, 4], [True] * 3)),
        ([3], recurrent_metadata([3], [True], snapshots=True)),
        ([3], recurrent_metadata([3], [True], parents=[[-1, 0, 0]], snapshots=True)),
    ]
    with forward_settings(True):
        for lengths, recurrent in forms:
            run_step(mixer, True, x[: sum(lengths)], lengths, recurrent)
    assert [name for name, _ in launches] == ["_scan_any_length", "_norm_any_length"] * 4
    # the run's form an argument: no TREE compiled in
    assert {kwargs["FORM_ARG"] for _, kwargs in launches} == {True}
    assert blocks == [6] * 4  # the heads of one run, whatever the batch
    launches.clear()
    blocks.clear()
    run_step(mixer, True, x, *forms[1])
    assert [name for name, _ in launches] == ["_scan_kernel", "_norm_kernel"] and blocks == [18]


def test_the_modes_kernels_take_int64_tree_parents_and_refuse_others():
    """The step kernels' parents operand (``RecurrentMetadata.kernel_parents``): in batch-invariant mode a
    chain passes an int64 tensor as a tree does (one compilation for both forms), and a tree whose parents are
    of another dtype is refused by name rather than compiled apart; outside the mode a chain passes its token
    table."""
    table = torch.zeros(1, 3, dtype=torch.int32, device=DEVICE)
    chain = recurrent_metadata([3], [True])
    with forward_settings(True):
        assert chain.kernel_parents(table).dtype == torch.int64
        tree = recurrent_metadata([3], [True], parents=[[-1, 0, 0]], snapshots=True)
        assert tree.kernel_parents(table) is tree.parents
        tree.parents = tree.parents.to(torch.int32)
        with pytest.raises(ValueError, match="parents are int64"):
            tree.kernel_parents(table)
    assert chain.kernel_parents(table) is table
