"""Gated DeltaNet's few-row step as one kernel (layers/deltanet_step_kernel.py; in Triton's interpreter
here, compiled on a GPU) against the layer's torch path (``GatedDeltaNet.forward`` with ``fused_step``
off): the layer output, the state rows and the snapshot rows after decode (into the snapshots, as the
engine's step, and into the row, as a recurrent draft's), verify chains, draft trees, runs padded to the
longest and sequences starting from zeros, in both checkpoint layouts and with one or two value heads
per key head and odd head sizes; each value head whole in one program, and split over 2 or 4 (the few-sequence
grids). On a GPU also: bf16 at the Qwen3.5 shape, and inside a CUDA graph."""

from __future__ import annotations

import dataclasses

import pytest
import torch

pytest.importorskip("triton")

from helpers.hopper_compile import run_compile_script  # noqa: E402
from helpers.kernel_checks import record_launches  # noqa: E402
from outpace.attention import build_paged_metadata, forward_context  # noqa: E402
from outpace.attention.context import forward_settings  # noqa: E402
from outpace.layers import deltanet_step_kernel, zeroed_scratch  # noqa: E402
from outpace.layers.decoder import pack_projections  # noqa: E402
from outpace.layers.gated_deltanet import GatedDeltaNet  # noqa: E402
from outpace.layers.recurrent import RecurrentMetadata  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # compiled on a GPU, else the interpreter
TOLERANCE = dict(rtol=1e-5, atol=1e-5) if DEVICE == "cpu" else dict(rtol=1e-4, atol=1e-4)
POOL_ROWS, SNAPSHOT_ROWS = 5, 8
STATE_INDICES = [3, 0, 2]  # each sequence's state row (rows 1 and 4 belong to no one here)
TREE = [[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4], [-1, 0, 0, 0, 3, 3]]
SHAPES = {
    "grouped": dict(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=6),
    "odd, one per key head": dict(num_k_heads=3, num_v_heads=3, head_k_dim=5, head_v_dim=7),
    # value heads to split: 32 columns a program over 2, 16 over 4
    "wide values": dict(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=64),
    # the same, one key head's group of two
    "wide values, one group": dict(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=64),
}
# form -> (query lengths, has_initial_state, parents, snapshots[, last_row: a chain's verify that leaves the state
# after its last token in the row, RecurrentMetadata.last_row])
FORMS = {
    "decode": ([1, 1, 1], [True, True, True], None, True),
    "decode into the row": ([1, 1, 1], [True, False, True], None, False),
    "verify chain of 2": ([2, 2, 2], [True, True, False], None, True),
    "verify chain of 8": ([8, 8, 8], [True, True, True], None, True),
    "tree": ([6, 6, 6], [True, False, True], TREE, True),
    "padded runs into the row": ([5, 1, 3], [False, True, True], None, False),
    "padded verify": ([4, 2, 3], [True, True, True], None, True),
    "verify chain of 3, its end in the row": ([3, 3, 3], [True, False, True], None, True, 2),
    "padded verify, its end in the row": ([4, 2, 4], [True, True, True], None, True, 3),
}


def make_layer(packed_by_key_head, seed=0, dtype=torch.float32, device=DEVICE, hidden=12, **shape):
    torch.manual_seed(seed)
    layer = GatedDeltaNet(
        hidden,
        conv_width=4,
        eps=1e-6,
        activation="silu",
        packed_by_key_head=packed_by_key_head,
        **shape,
    )
    with torch.no_grad():
        for p in layer.parameters():  # linear weights [out, in] scaled to keep unit activations
            p.copy_(torch.randn_like(p) * (p.shape[1] ** -0.5 if p.dim() == 2 else 0.5))
    return layer.to(device, dtype)


def pool(layer, seed, dtype=torch.float32, device=DEVICE):
    """Random state rows and snapshot rows (so a row the kernel should write and does not shows)."""
    g = torch.Generator().manual_seed(seed)
    states, snapshots = {}, {}
    for name, (shape, declared) in layer.state_shapes().items():
        kind = dict(dtype=declared or dtype, device=device)
        states[name] = torch.randn(POOL_ROWS, *shape, generator=g).to(**kind)
        snapshots[name] = torch.randn(POOL_ROWS, SNAPSHOT_ROWS, *shape, generator=g).to(**kind)
    return states, snapshots


def form_metadata(form, state_indices, device, run_lens=None):
    """(attention metadata, RecurrentMetadata) of ``form``'s runs (FORMS), sequence i at state row
    ``state_indices[i]``; ``run_lens``: each run's tokens that advance its state (the rest padding, as in a
    captured prefill's chunks), None: all."""
    lengths, start, parents, keep_every, *end = form
    meta = build_paged_metadata(
        [[i] for i in range(len(lengths))], [0] * len(lengths), lengths, 32, device
    )
    recurrent = RecurrentMetadata(
        torch.tensor(state_indices, device=device),
        torch.tensor(start, device=device),
        None if parents is None else torch.tensor(parents, device=device),
        keep_every,
        end[0] if end else None,
        None if run_lens is None else torch.tensor(run_lens, device=device),
    )
    return meta, recurrent


def step(layer, fused, x, form, states, snapshots, state_indices=STATE_INDICES, run_lens=None):
    """One forward of the layer over ``form``'s runs (FORMS) on copies of the pool, sequence i at state row
    ``state_indices[i]`` (``run_lens``: form_metadata's) -> (out, states, snapshots)."""
    states = {k: v.clone() for k, v in states.items()}
    snapshots = {k: v.clone() for k, v in snapshots.items()}
    layer.bind_state(states, snapshots)
    layer.fused_step = fused
    meta, recurrent = form_metadata(form, state_indices, x.device, run_lens)
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        out = layer(x)
    return out, states, snapshots


def assert_same_step(got, want, form, snapshots_before, **tolerance):
    """Outputs and state rows equal; snapshot rows equal at every valid position and untouched elsewhere
    (the torch path also fills a padded position's row, which no commit reads), and with ``last_row`` untouched
    there (its state is the row's)."""
    lengths, _, _, keep_every, *end = form
    (out, states, snapshots), (out_ref, states_ref, snapshots_ref) = got, want
    torch.testing.assert_close(out, out_ref, **tolerance)
    for name in states:
        torch.testing.assert_close(states[name], states_ref[name], **tolerance)
        rest = snapshots[name].clone()
        if keep_every:
            for row, n in zip(STATE_INDICES, lengths):
                kept = [t for t in range(n) if not end or t != end[0]]
                got_rows, want_rows = snapshots[name][row, kept], snapshots_ref[name][row, kept]
                torch.testing.assert_close(got_rows, want_rows, **tolerance)
                rest[row, kept] = snapshots_before[name][row, kept]
        assert torch.equal(rest, snapshots_before[name])


# (form, checkpoint layout, shape): every form, layout and shape, not every combination (the interpreter is
# slow); the row written (decode: the step's launch and the q / k conv channels' second) in both layouts, with
# value heads that share a key head
CASES = [
    ("decode", "qwen3_5", "grouped"),
    ("decode into the row", "qwen3_5", "grouped"),
    ("decode into the row", "qwen3_next", "odd, one per key head"),
    ("verify chain of 2", "qwen3_5", "odd, one per key head"),
    ("verify chain of 8", "qwen3_next", "odd, one per key head"),
    ("tree", "qwen3_next", "grouped"),
    ("padded runs into the row", "qwen3_next", "grouped"),
    ("padded verify", "qwen3_5", "odd, one per key head"),
    ("verify chain of 3, its end in the row", "qwen3_5", "grouped"),
    ("padded verify, its end in the row", "qwen3_next", "odd, one per key head"),
]


@pytest.mark.parametrize("form, layout, shape", CASES)
def test_fused_step_equals_the_torch_path(form, layout, shape):
    layer = make_layer(layout == "qwen3_next", **SHAPES[shape])
    x = torch.randn(sum(FORMS[form][0]), 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    want = step(layer, False, x, FORMS[form], states, snapshots)
    if (
        shape == "grouped"
    ):  # the served layout: the in-projections as one matmul, read through its views
        pack_projections(layer)
        assert layer.in_proj is not None
    got = step(layer, True, x, FORMS[form], states, snapshots)
    assert_same_step(got, want, FORMS[form], snapshots, **TOLERANCE)
    if form == "tree":  # the parents matter: as a chain the same tokens give other outputs
        lengths, start, _, _ = FORMS[form]
        chain = step(layer, False, x, (lengths, start, None, True), states, snapshots)
        assert not torch.allclose(chain[0], want[0], atol=1e-3)


@pytest.mark.parametrize(
    "fused, splits", [(True, 1), (True, 2), (False, 1)], ids=["fused", "split", "torch"]
)
def test_padding_keeps_the_state_whatever_its_rows_hold(fused, splits, monkeypatch):
    """A captured prefill pads its chunks to one length (RecurrentMetadata.run_lens, engine/prefill_graphs.py),
    and a padding row holds what the layer before left there: NaN possibly (a recurrent layer's output row
    that no program writes). The state after each run and its valid outputs equal those of the same runs
    with zeros in the padding rows, and the kernel leaves zeros in the padding rows of its output, so the layers
    after it read finite rows (on the GPU a Qwen3-Next prompt's tokens were all 0 so)."""
    monkeypatch.setattr(deltanet_step_kernel, "value_splits", lambda *args: splits)
    new_empty = (
        torch.Tensor.new_empty
    )  # memory no one wrote holds NaN here (the kernel's tensors are its)

    def nan_filled(self, *args, **kwargs):
        t = new_empty(self, *args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch.Tensor, "new_empty", nan_filled)
    layer = make_layer(True, **SHAPES["wide values, one group" if splits > 1 else "grouped"])
    form, run_lens = ([4, 4, 4], [True, False, True], None, False), [2, 4, 1]
    padding = torch.tensor([t >= n for n in run_lens for t in range(4)], device=DEVICE)
    x = torch.randn(12, 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    clean, poisoned = (
        step(layer, fused, x.masked_fill(padding[:, None], fill), form, states, snapshots,
             run_lens=run_lens)
        for fill in (0.0, float("nan"))
    )  # fmt: skip
    torch.testing.assert_close(poisoned[0][~padding], clean[0][~padding], rtol=0, atol=0)
    if (
        fused
    ):  # the kernel's padding rows are zeros, whatever they held (the torch path computes them)
        assert not poisoned[0][padding].any()
    for name in clean[1]:
        assert not clean[1][name].isnan().any()
        torch.testing.assert_close(poisoned[1][name], clean[1][name], rtol=0, atol=0)


# (form, checkpoint layout, shape, programs per value head): every form split, over 2 and 4, in both layouts;
# the odd shape's 7 columns over 2 programs of 4 (the second has 3); two key heads' groups (each group's q / k
# conv channels written by its last head) into the row and into the snapshots, the other forms one group (half
# the programs: the interpreter runs them one after the other)
SPLIT_CASES = [
    ("decode", "qwen3_5", "wide values, one group", 4),
    ("decode into the row", "qwen3_next", "wide values", 2),
    ("verify chain of 2", "qwen3_5", "wide values", 2),
    ("verify chain of 8", "qwen3_next", "wide values, one group", 2),
    ("tree", "qwen3_next", "wide values, one group", 2),
    ("padded runs into the row", "qwen3_5", "wide values, one group", 2),
    ("padded verify", "qwen3_next", "odd, one per key head", 2),
    ("verify chain of 3, its end in the row", "qwen3_next", "wide values, one group", 4),
]


@pytest.mark.parametrize("form, layout, shape, splits", SPLIT_CASES)
def test_split_value_heads_equal_the_torch_path(form, layout, shape, splits, monkeypatch):
    """Each value head's columns over ``splits`` programs, the head's last to finish normalising its rows:
    the same step, and every arrival counter zero again after it (the next launch's start)."""
    layer = make_layer(layout == "qwen3_next", **SHAPES[shape])
    x = torch.randn(sum(FORMS[form][0]), 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    want = step(layer, False, x, FORMS[form], states, snapshots)
    monkeypatch.setattr(deltanet_step_kernel, "value_splits", lambda *shape: splits)
    monkeypatch.setattr(zeroed_scratch, "_BUFFERS", {})
    got = step(layer, True, x, FORMS[form], states, snapshots)
    assert_same_step(got, want, FORMS[form], snapshots, **TOLERANCE)
    counters = {
        key[0]: buffer for key, buffer in zeroed_scratch._BUFFERS.items()
    }  # owner -> buffer
    split = counters.pop("layers/deltanet_step_kernel.py: the split step's arrival counters")
    assert split.numel() == len(STATE_INDICES) * layer.num_v_heads  # (the split launch ran)
    # a row write's key-head counters (the q / k conv channels' last reader) besides
    assert len(counters) == (0 if FORMS[form][3] and len(FORMS[form]) == 4 else 1)
    assert not any(c.any() for c in [split, *counters.values()])


# (form, checkpoint layout, shape, programs per value head): a decode, a chain's verify its end in the row, a tree
BA_CASES = [
    ("decode", "qwen3_next", "grouped", 1),
    ("verify chain of 3, its end in the row", "qwen3_5", "odd, one per key head", 1),
    ("tree", "qwen3_next", "wide values, one group", 2),
]


@pytest.mark.parametrize("form, layout, shape, splits", BA_CASES)
@pytest.mark.parametrize(
    "norm", [False, True], ids=["normalised input", "stream times norm weight"]
)
def test_b_and_a_from_the_rows_equal_their_projections(
    form, layout, shape, splits, norm, monkeypatch
):
    """``ProjectedRows.ba_rows``: the kernel projecting b and a itself, from the normalised input or from the
    stream times the norm's weight with the stream's partial sums of squares (the norm's factor folded in:
    a stream of rms about 3), each value head's split programs alike, gives the step of their projections."""
    layer = make_layer(layout == "qwen3_next", **SHAPES[shape])
    n, eps = sum(FORMS[form][0]), 1e-6
    g = torch.Generator().manual_seed(1)
    stream, weight = 3 * torch.randn(n, 12, generator=g), torch.rand(12, generator=g) + 0.5
    x = (
        stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps) * weight
    )  # the layer's input
    states, snapshots = pool(layer, 2)
    monkeypatch.setattr(deltanet_step_kernel, "value_splits", lambda *shape: splits)
    want = step(layer, True, x.to(DEVICE), FORMS[form], states, snapshots)
    if (
        norm
    ):  # three partial sums of squares a row, as a kernel of three column programs writes them
        sq = stream.pow(2).reshape(n, 3, 4).sum(-1).T.contiguous()
        rows = deltanet_step_kernel.BaRows((stream * weight).to(DEVICE), sq.to(DEVICE), eps)
    else:
        rows = deltanet_step_kernel.BaRows(x.to(DEVICE), None, 0.0)
    in_step = [layer.in_proj_ba] if layer.packed_by_key_head else [layer.in_proj_b, layer.in_proj_a]

    def projected_from_the_rows(x):
        projected = [
            p.weight if any(p is q for q in in_step) else p(x) for p in layer.in_projections()
        ]
        return dataclasses.replace(layer._rows_of(tuple(projected)), ba_rows=rows)

    monkeypatch.setattr(layer, "_projected_rows", projected_from_the_rows)
    got = step(layer, True, x.to(DEVICE), FORMS[form], states, snapshots)
    assert_same_step(got, want, FORMS[form], snapshots, **TOLERANCE)


def test_value_splits_fill_the_gpu_only_at_small_batches():
    """Qwen3.5's 32 value heads of 128 columns on an H200's 132 SMs: up to one program an SM, at least
    32 columns a program; none once the heads alone fill half the GPU."""
    splits = [deltanet_step_kernel.value_splits(b, 32, 128, 132) for b in (1, 2, 4, 8, 32)]
    assert splits == [4, 2, 1, 1, 1]
    assert (
        deltanet_step_kernel.value_splits(1, 32, 63, 132) == 1
    )  # two programs would take 31 and 32


def test_batch_invariant_mode_never_splits(monkeypatch):
    """The split sets the compiled reductions' layout and follows the batch: the mode keeps one program a
    head whatever the batch."""
    chosen = []
    monkeypatch.setattr(
        deltanet_step_kernel, "value_splits", lambda *shape: chosen.append(shape) or 2
    )
    layer = make_layer(False, **SHAPES["wide values, one group"])
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    with forward_settings(True):
        step(layer, True, x, FORMS["decode"], states, snapshots)
    assert not chosen
    step(layer, True, x, FORMS["decode"], states, snapshots)
    assert chosen == [(3, 2, 64, deltanet_step_kernel.num_sms(x.device))]


@pytest.mark.parametrize("form", ["decode", "verify chain of 3, its end in the row"])
def test_batch_invariant_mode_turns_contraction_off(form, monkeypatch):
    """In the mode the launch turns floating-point contraction off, so that a token decoded alone and the same
    token in a verified chain round alike (on the H200 this removed one of the two positions where MTP's
    log-probabilities left plain decoding's: benchmarks/results/gpu_2026-12-03c)."""
    launches = []
    for name in ("_deltanet_step_any_form", "_deltanet_step_kernel"):
        record_launches(monkeypatch, deltanet_step_kernel, name, launches)
    layer = make_layer(False, **SHAPES["grouped"])
    x = torch.randn(3 * FORMS[form][0][0], 12, generator=torch.Generator().manual_seed(1)).to(
        DEVICE
    )
    states, snapshots = pool(layer, 2)
    with forward_settings(True):
        step(layer, True, x, FORMS[form], states, snapshots)
    step(layer, True, x, FORMS[form], states, snapshots)
    assert [kwargs.get("enable_fp_fusion", True) for _, kwargs in launches] == [False, True]


def test_batch_invariant_mode_compiles_one_kernel_for_every_run(monkeypatch):
    """A decode, a verify of 3 tokens and a draft tree launch the kernel whose run length and form are arguments
    in the mode (compiled for each length, one token's float32 state took other last bits on the H200; compiled
    for a tree, a node's), and each its own compilation outside it."""
    launches = []
    for name in ("_deltanet_step_kernel", "_deltanet_step_any_form"):
        record_launches(monkeypatch, deltanet_step_kernel, name, launches)
    layer = make_layer(False, **SHAPES["grouped"])
    x = torch.randn(18, 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    forms = [
        FORMS[f] for f in ("decode into the row", "verify chain of 3, its end in the row", "tree")
    ]
    for invariant in (True, False):
        with forward_settings(invariant):
            for form in forms:
                step(layer, True, x[: sum(form[0])], form, states, snapshots)
    constants = [
        (name, *(kwargs[k] for k in ("LENGTH", "SPECIALIZED", "BT"))) for name, kwargs in launches
    ]
    assert constants[:3] == [("_deltanet_step_any_form", 16, False, 16)] * 3
    assert constants[3:] == [
        ("_deltanet_step_kernel", 1, True, 1),
        ("_deltanet_step_kernel", 3, True, 4),
        ("_deltanet_step_kernel", 6, True, 8),
    ]


# Compiled for an H100 / H200 (sm_90) without a GPU, in a process of its own (the interpreter replaces
# @triton.jit here): what the interpreter cannot see (compile errors, registers spilled to local memory).
# (run after helpers/hopper_compile.py's preamble: compile_for_hopper, ptxas_report) Each argument one
# compile, "tree,snapshots,length,splits,in_row,ba_rows", its output after a line "### <argument>".
SM90_COMPILE = """
from outpace.layers.deltanet_step_kernel import FUSED_MAX_LEN, _deltanet_step_kernel, num_warps

bf16 = ("qkv", "z", "b", "a", "conv_w", "A_log", "dt_bias", "norm_w", "conv_state", "conv_snap", "out",
        "x_rows")
types = dict({n: "*bf16" for n in bf16}, eps="fp32", scale="fp32", table="*i32", query_lens="*i64",
             has_initial="*i1", state_indices="*i64", parents="*i64", rec_state="*fp32", rec_snap="*fp32",
             o_part="*fp32", counters="*i32", qk_counters="*i32", sq_parts="*fp32", in_eps="fp32")
for config in sys.argv[1:]:
    tree, snapshots, length, splits, in_row, ba_rows = (int(a) for a in config.split(","))
    bound = length or FUSED_MAX_LEN  # length 0: batch-invariant mode's compilation for every run length
    constants = dict(K_HEADS=16, V_HEADS=32, GROUP=2, DK=128, DV=128,
                     KEEP=3, BK=128, BV=128 // splits, BW=4, LENGTH=bound, SPECIALIZED=length > 0,
                     BT=triton.next_power_of_2(bound),
                     TREE=bool(tree), SNAPSHOTS=bool(snapshots), LAST_IN_ROW=bool(in_row), SPLITS=splits,
                     PDL=True, PREFETCH_LINES=max(1, 128 // splits // 32), BA_ROWS=bool(ba_rows),
                     ROW_NORM=bool(ba_rows), BH=256, BP=16)
    options = {} if length else dict(enable_fp_fusion=False)
    compiled = compile_for_hopper(_deltanet_step_kernel, types, constants,
                                  num_warps=num_warps(128, 128 // splits), **options)
    print("###", config)
    print(ptxas_report(compiled))
    print("token loop barriers", loop_barriers(compiled))
"""

# id -> (tree, snapshots, length, splits, in_row, b and a from the rows with the norm folded: ProjectedRows.ba_rows)
# (a decode is the chain's loop once; length 0: batch-invariant mode's one compilation, the length an argument)
SM90_CONFIGS = {
    "verify chain of 8": (0, 1, 8, 1, 0, 0),
    "tree of 8": (1, 1, 8, 1, 0, 0),
    "decode into the row": (0, 0, 1, 1, 0, 0),
    "decode, heads over 8": (0, 1, 1, 8, 0, 0),
    "verify chain of 8, heads over 4": (0, 1, 8, 4, 0, 0),
    "tree of 8, heads over 8": (1, 1, 8, 8, 0, 0),
    "decode into the row, heads over 8": (0, 0, 1, 8, 0, 0),
    "verify chain of 3, its end in the row, heads over 4": (0, 1, 3, 4, 1, 0),
    "verify chain of 8, its end in the row": (0, 1, 8, 1, 1, 0),
    "batch-invariant, into the row": (0, 0, 0, 1, 0, 0),
    "batch-invariant, a chain's end in the row": (0, 1, 0, 1, 1, 0),
    "batch-invariant, snapshots only (a tree's)": (0, 1, 0, 1, 0, 0),
    "b and a from the rows, decode into the row, heads over 4": (0, 0, 1, 4, 0, 1),
    "b and a from the rows, verify chain of 3, its end in the row, heads over 4": (
        0,
        1,
        3,
        4,
        1,
        1,
    ),
    "b and a from the rows, batch-invariant, into the row": (0, 0, 0, 1, 0, 1),
}


@pytest.fixture(scope="module")
def sm90_compiled(tmp_path_factory):
    """Every SM90_CONFIGS compiled in one process (its start and imports took most of a compile's time) ->
    (the process, {id: its compile's output})."""
    configs = {name: ",".join(map(str, config)) for name, config in SM90_CONFIGS.items()}
    done = run_compile_script(SM90_COMPILE, *configs.values(), cwd=tmp_path_factory.mktemp("sm90"))
    outputs = dict(part.split("\n", 1) for part in done.stdout.split("### ")[1:])
    return done, {name: outputs.get(config, "") for name, config in configs.items()}


@pytest.mark.parametrize("config", list(SM90_CONFIGS))
def test_kernel_compiles_for_sm90_without_spills(config, sm90_compiled):
    """At the Qwen3.5 shape and the launcher's num_warps, each value head whole in one program and split
    (batch 1 to 4 on an H200: value_splits)."""
    done, outputs = sm90_compiled
    assert done.returncode == 0, done.stderr[-3000:]
    assert outputs[config].count("0 bytes spill stores") == 1, done.stdout


def test_a_verified_token_meets_its_warps_at_few_barriers(sm90_compiled):
    """Qwen3.5's batch-1 verify of 3 tokens (4 programs a value head, the chain's end in the row, as the engine
    verifies MTP's drafts): the token loop's reductions are joined (module docstring), 13 barriers a token where
    separate reductions took 19; a reduction split apart again adds 3 or more."""
    done, outputs = sm90_compiled
    assert done.returncode == 0, done.stderr[-3000:]
    output = outputs["verify chain of 3, its end in the row, heads over 4"]
    barriers = output.split("token loop barriers")[1].split()[0]
    assert barriers != "None" and int(barriers) <= 13, (
        done.stdout
    )  # (a loop of 3 tokens, not unrolled)


# ---- GPU only ------------------------------------------------------------------------------------------------

# transformers' Qwen3_5TextConfig defaults (bench/hybrid_shape.py's reference shape: hidden 4096)
QWEN3_5 = dict(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "form", ["decode", "verify chain of 8", "tree", "padded runs into the row"]
)
@pytest.mark.parametrize("packed_by_key_head", [False, True], ids=["qwen3_5", "qwen3_next"])
def test_fused_step_in_bf16_at_the_qwen3_5_shape(form, packed_by_key_head):
    """bf16 weights and conv state, float32 recurrent state: the kernel computes the conv, the norms and the
    gate in float32 where the eager path rounds to bf16 between its operations, so the two agree to bf16's
    precision (relative error of each tensor)."""
    layer = make_layer(
        packed_by_key_head, dtype=torch.bfloat16, device="cuda", hidden=256, **QWEN3_5
    )
    with torch.no_grad():
        layer.A_log.uniform_(-2, 0)  # moderate decays over the run
    x = torch.randn(sum(FORMS[form][0]), 256, generator=torch.Generator().manual_seed(1))
    x = x.to("cuda", torch.bfloat16)
    states, snapshots = pool(layer, 2, torch.bfloat16, "cuda")
    states["recurrent"] *= 0.1
    want = step(layer, False, x, FORMS[form], states, snapshots)
    got = step(layer, True, x, FORMS[form], states, snapshots)

    def assert_near(a, b):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 2e-2

    assert_near(got[0], want[0])
    lengths, _, _, keep_every = FORMS[form]
    for name in got[1]:
        assert_near(got[1][name], want[1][name])
        if keep_every:
            for row, n in zip(STATE_INDICES, lengths):
                assert_near(got[2][name][row, :n], want[2][name][row, :n])


@pytest.mark.gpu
@pytest.mark.parametrize("shape, splits", [("grouped", 1), ("wide values", 4)])
def test_fused_step_replays_inside_a_cuda_graph(shape, splits, monkeypatch):
    """Replayed twice: a split launch's arrival counters are zero again for the second."""
    monkeypatch.setattr(deltanet_step_kernel, "value_splits", lambda *shape: splits)
    layer = make_layer(False, device="cuda", **SHAPES[shape])
    form = FORMS["tree"]
    x = torch.randn(sum(form[0]), 12, device="cuda")
    states, snapshots = pool(layer, 2, device="cuda")
    eager = step(layer, True, x, form, states, snapshots)
    lengths, start, parents, keep_every = form
    meta = build_paged_metadata([[i] for i in range(3)], [0] * 3, lengths, 16, "cuda")
    meta.token_table()
    recurrent = RecurrentMetadata(
        torch.tensor(STATE_INDICES, device="cuda"),
        torch.tensor(start, device="cuda"),
        torch.tensor(parents, device="cuda"),
        keep_every,
    )
    live = ({k: v.clone() for k, v in states.items()}, {k: v.clone() for k, v in snapshots.items()})
    layer.bind_state(*live)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            layer(x)  # compiled outside the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            out = layer(x)
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert_same_step((out, *live), eager, form, snapshots, rtol=0, atol=0)  # the same kernel


def test_long_runs_and_other_activations_keep_the_torch_path(monkeypatch):
    """The kernel takes runs of at most FUSED_MAX_LEN tokens with silu; a longer prefill chunk (the chunked
    kernels' case on a GPU) or another activation runs the torch path."""
    calls = []
    layer = make_layer(False, **SHAPES["grouped"])
    monkeypatch.setattr(
        deltanet_step_kernel,
        "deltanet_step",
        lambda rows, *args: (
            calls.append(args) or rows.qkv.new_zeros(len(rows.qkv), layer.value_dim)
        ),
    )
    states, snapshots = pool(layer, 2)
    long_runs = ([deltanet_step_kernel.FUSED_MAX_LEN + 1, 3, 1], [True, False, True], None, False)
    x = torch.randn(sum(long_runs[0]), 12, device=DEVICE)
    step(layer, True, x, long_runs, states, snapshots)
    layer.activation = "gelu"
    step(layer, True, x[:3], FORMS["decode"], states, snapshots)
    assert not calls
    layer.activation = "silu"
    step(layer, True, x[:3], FORMS["decode"], states, snapshots)
    assert len(calls) == 1


def test_served_tokens_with_the_fused_step_equal_the_torch_paths(tmp_path, monkeypatch):
    """Through the engine (short prefill chunks, verify of an EAGLE3 tree, snapshot commits), a tiny Qwen3.5's
    greedy tokens with its few-row steps fused equal those of the torch path."""
    from helpers.hybrid_models import make_hybrid, save_hybrid
    from helpers.spec_models import make_eagle3_draft
    from outpace import LLM, SamplingParams
    from outpace.config import SpeculativeConfig

    path = save_hybrid(make_hybrid("qwen3_5"), tmp_path / "qwen3_5")
    eagle3 = make_eagle3_draft(path, tmp_path / "eagle3")
    prompts = [[3, 17, 99, 100, 8, 42, 7], [5, 9]]
    # 3 tokens: the prefill's, then a verify's each (the random draft's tokens are rejected), the second
    # verify from the state the first committed
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    spec = SpeculativeConfig("eagle3", str(eagle3), num_steps=2, topk=2, num_draft_tokens=4)
    calls = []
    step_kernel = deltanet_step_kernel.deltanet_step
    monkeypatch.setattr(
        deltanet_step_kernel,
        "deltanet_step",
        lambda *args: calls.append(args[8].parents is not None) or step_kernel(*args),
    )
    tokens = {}
    for fused in (False, True):
        monkeypatch.setattr(GatedDeltaNet, "fused_step", fused)
        llm = LLM(
            str(path),
            device=DEVICE,
            dtype="float32",
            block_size=4,
            max_num_batched_tokens=8,
            speculative=spec,
        )
        tokens[fused] = [o.token_ids for o in llm.generate(prompts, params)]
    assert tokens[True] == tokens[False]
    assert any(calls) and not all(
        calls
    )  # the kernel served the trees' verifies and the prefill chunks


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "torch"])
def test_a_verified_chain_has_the_bits_of_its_tokens_decoded_one_by_one(fused):
    """Batch-invariant mode's premise for the recurrent layers: a chain of 3 tokens verified in one forward
    (state after each into the snapshots) gives each token's output and state bit for bit as 3 decode steps,
    each committed into the row before the next (in the interpreter: the kernel's arithmetic, not the
    GPU's compiled reduction orders). The torch path holds it on the CPU only: on the GPU its chunked scan
    and cuBLAS products follow the run's length (the engine's mode takes the kernel there)."""
    if DEVICE == "cuda" and not fused:
        pytest.skip("the torch path's GPU reductions follow the run's length")
    layer = make_layer(False, **SHAPES["grouped"])
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    states, snapshots = pool(layer, 2)
    rows = STATE_INDICES[:1]
    chain = ([3], [True], None, True)
    with forward_settings(True):
        out, _, verified = step(layer, fused, x, chain, states, snapshots, rows)
        decoded = []
        for t in range(3):
            o, _, snapshots = step(
                layer, fused, x[t : t + 1], ([1], [True], None, True), states, snapshots, rows
            )
            decoded.append(o)
            states = {k: v.clone() for k, v in states.items()}
            for k in states:  # the commit: snapshot 0 becomes the row
                states[k][rows[0]] = snapshots[k][rows[0], 0]
    assert torch.equal(out, torch.cat(decoded))
    for k in states:
        assert torch.equal(verified[k][rows[0], 2], states[k][rows[0]])


# the zoo's tinyqwen35 linear-attention shape (zoo/tinyqwen35/config.json: hidden 128, 2 key heads and 4
# value heads of 32)
TINYQWEN35 = dict(num_k_heads=2, num_v_heads=4, head_k_dim=32, head_v_dim=32)


def kernel_step(layer, rows, form, states, snapshots, state_indices):
    """``step`` from given projections ``rows`` (ProjectedRows): the step kernel alone, on copies of the pool."""
    states = {k: v.clone() for k, v in states.items()}
    snapshots = {k: v.clone() for k, v in snapshots.items()}
    meta, recurrent = form_metadata(form, state_indices, rows.qkv.device)
    with torch.no_grad(), forward_context(meta, recurrent=recurrent):
        out = deltanet_step_kernel.deltanet_step(
            rows, layer.conv1d.weight, layer.A_log, layer.dt_bias, layer.norm.weight,
            layer.norm.eps, meta.token_table(), meta.query_lens, recurrent, states, snapshots,
            layer.num_k_heads, layer.head_k_dim, layer.head_v_dim,
        )  # fmt: skip
    return out, states, snapshots


def token_rows(rows, t):
    """Token t's projections alone (views of ``rows``' tensors)."""
    return dataclasses.replace(
        rows, qkv=rows.qkv[t : t + 1], z=rows.z[t : t + 1], b=rows.b[t : t + 1], a=rows.a[t : t + 1]
    )


def bits_case(seed, shape, tokens):
    """The bit tests' layer at ``shape`` ("tinyqwen35" or "qwen3.5"; bf16 on a GPU, float32 in the interpreter)
    with moderate decays, ``tokens`` random input rows and a pool whose recurrent rows are of trained scale ->
    (layer, x, states, snapshots)."""
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    hidden, heads = (128, TINYQWEN35) if shape == "tinyqwen35" else (256, QWEN3_5)
    layer = make_layer(False, seed=seed, dtype=dtype, hidden=hidden, **heads)
    with torch.no_grad():
        layer.A_log.uniform_(-2, 0)  # moderate decays over the run
    g = torch.Generator().manual_seed(100 + seed)
    x = torch.randn(tokens, hidden, generator=g).to(DEVICE, dtype)
    states, snapshots = pool(layer, seed, dtype)
    states["recurrent"] *= 0.1
    return layer, x, states, snapshots


@pytest.mark.parametrize("seed", range(16 if DEVICE == "cuda" else 1))
@pytest.mark.parametrize("projections", ["layer", "kernel alone"])
@pytest.mark.parametrize("shape", ["tinyqwen35", "qwen3.5"] if DEVICE == "cuda" else ["tinyqwen35"])
def test_an_mtp_verify_has_the_bits_of_plain_decoding(seed, projections, shape):
    """The launches batch-invariant serving makes, compared bit for bit (bf16 on a GPU): plain decoding's steps
    into the row (no snapshots), one token at a time, against MTP's verify of the same 3 tokens (a chain with
    snapshots, its last token's state in the row), at the zoo's tinyqwen35 shape and (on a GPU) Qwen3.5's;
    through the layer (its in-projections of 3 rows and of 1), and the kernel alone on the same projections.
    The float32 state after each token shows any difference in the arithmetic, where the bf16 output rounds
    most of it away: with a compilation for each run length, every seed failed on the H200 (token 0's state),
    where tests/gpu/test_batch_invariant_hybrids_gpu.py saw one bf16 output in ~10^4 differ
    (benchmarks/results/gpu_2026-12-03d calls 1-3)."""
    layer, x, states, snapshots = bits_case(seed, shape, 3)
    rows = STATE_INDICES[:1]
    chain, decode = ([3], [True], None, True, 2), ([1], [True], None, False)
    with forward_settings(True):
        if projections == "layer":
            out, verified, kept = step(layer, True, x, chain, states, snapshots, rows)
        else:
            with torch.no_grad():
                projected = layer._projected_rows(x)
            out, verified, kept = kernel_step(layer, projected, chain, states, snapshots, rows)
        decoded, after = [], []
        for t in range(3):
            if projections == "layer":
                o, states, _ = step(layer, True, x[t : t + 1], decode, states, snapshots, rows)
            else:
                one = token_rows(projected, t)
                o, states, _ = kernel_step(layer, one, decode, states, snapshots, rows)
            decoded.append(o)
            after.append({k: v[rows[0]] for k, v in states.items()})
    for t in range(2):  # the snapshots of the chain's first two tokens
        for k in after[t]:
            assert torch.equal(kept[k][rows[0], t], after[t][k]), (t, k)
    for k in verified:
        assert torch.equal(verified[k][rows[0]], after[2][k]), k
    assert torch.equal(out, torch.cat(decoded))


@pytest.mark.parametrize("seed", range(8 if DEVICE == "cuda" else 1))
@pytest.mark.parametrize("shape", ["tinyqwen35", "qwen3.5"] if DEVICE == "cuda" else ["tinyqwen35"])
def test_a_tree_node_has_the_bits_of_its_path_decoded(seed, shape):
    """Batch-invariant mode, the kernel alone (bf16 on a GPU): a draft tree's node 3 (parents -1, 0, 0, 1: its
    path 0, 1, 3) gets, with its ancestors, the outputs and float32 states that decoding the path's tokens one at
    a time into the row gives (the tree's own compilation against decode's)."""
    layer, x, states, snapshots = bits_case(seed, shape, 4)
    rows, path = STATE_INDICES[:1], [0, 1, 3]
    with forward_settings(True), torch.no_grad():
        projected = layer._projected_rows(x)
        tree = ([4], [True], [[-1, 0, 0, 1]], True)
        out, _, kept = kernel_step(layer, projected, tree, states, snapshots, rows)
        for t in path:
            one = token_rows(projected, t)
            o, states, _ = kernel_step(
                layer, one, ([1], [True], None, False), states, snapshots, rows
            )
            assert torch.equal(out[t], o[0]), t
            for k in states:
                assert torch.equal(kept[k][rows[0], t], states[k][rows[0]]), (t, k)
