"""The hybrid stacks' fused residual path (models/qwen3_next.py, models/nemotron_h.py over layers/fused_decoder.py
``run_fused_layers``; forced on here, its kernels in Triton's interpreter on the CPU) computes what their eager
path computes: a decode or verify step after an eager prefill gives the same logits, KV and recurrent state
(rows and snapshots) in float32, on tiny random Qwen3-Next (linear and full attention, a dense and a MoE MLP),
Qwen3.5 and Nemotron-H (Mamba2, MoE, attention and MLP blocks) models; and no block norm runs on its own
there, where the eager path runs one before every mixer and every MLP."""

import pytest
import torch

from helpers.fused_decode import record_fp8_epilogues
from helpers.hybrid_models import HYBRIDS, make_hybrid, save_hybrid
from helpers.quantized_checkpoints import (
    block_fp8_config,
    is_projection,
    modelopt_config,
    write_quantized,
)

pytest.importorskip("triton")

from outpace.attention import build_paged_metadata, forward_context  # noqa: E402
from outpace.attention.triton_backend import TritonAttentionBackend  # noqa: E402
from outpace.cache.block_pool import BlockPool  # noqa: E402
from outpace.cache.kv_cache import bind_kv_cache  # noqa: E402
from outpace.layers import deltanet_step_kernel, fused_decoder  # noqa: E402
from outpace.layers.gated_deltanet import GatedDeltaNet  # noqa: E402
from outpace.layers.linear import linear  # noqa: E402
from outpace.layers.mamba2 import Mamba2Mixer  # noqa: E402
from outpace.layers.moe import RoutedExperts  # noqa: E402
from outpace.layers.recurrent import RecurrentMetadata, RecurrentStateLayer  # noqa: E402
from outpace.layers.router import RoutingModule  # noqa: E402
from outpace.models.loader import load_model  # noqa: E402

if torch.cuda.is_available():  # (the interpreter runs the kernels on CPU tensors only)
    pytest.skip("forces the fused path onto CPU tensors", allow_module_level=True)

BLOCK_SIZE, POOL_ROWS, SNAPSHOT_ROWS = 4, 5, 4
TABLES = [[1, 2, 3], [4, 5], [6, 7]]  # (block 0 is the padding block)
PROMPT_LENS = [7, 2, 5]
STATE_ROWS = [2, 0, 3]
# form -> (tokens per sequence, snapshots): the engine's decode and verify keep every state in the snapshot
# rows; a recurrent draft's decode writes the row itself
FORMS = {"decode": (1, True), "verify of 3": (3, True), "decode into the row": (1, False)}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = save_hybrid(make_hybrid(variant), tmp_path_factory.mktemp(variant))
        return cache[variant]

    return get


def _bind_states(model) -> list[dict[str, torch.Tensor]]:
    """Zeroed state and snapshot rows bound to every recurrent layer -> the tensors, in module order."""
    pools = []
    for module in model.modules():
        if isinstance(module, RecurrentStateLayer):
            states, snapshots = {}, {}
            for name, (shape, dtype) in module.state_shapes().items():
                states[name] = torch.zeros(POOL_ROWS, *shape, dtype=dtype or torch.float32)
                snapshots[name] = torch.zeros(
                    POOL_ROWS, SNAPSHOT_ROWS, *shape, dtype=dtype or torch.float32
                )
            module.bind_state(states, snapshots)
            pools += [states, snapshots]
    return pools


def _forward(model, ids, positions, meta, recurrent, backend=None):
    with torch.inference_mode(), forward_context(meta, backend, recurrent=recurrent):
        return model.compute_logits(model(ids, positions).hidden_states)


def _served_step(
    path,
    monkeypatch,
    fused: bool,
    form: str,
    norms_run: list | None = None,
    moe_kernels: bool = False,
    triton_attention: bool = False,
):
    """An eager prefill of three prompts into the KV cache and the state rows, then one step of ``form``
    (FORMS) with the fused path forced on or off (the recurrent layers' step kernels on in both) -> (the
    step's logits, the KV caches, the state pools). ``norms_run``: gets each block norm's call during the
    step; ``moe_kernels``: the step's MoE blocks route and run their experts on the kernels;
    ``triton_attention``: the step attends on the Triton backend (the one that attends over a cache the
    fused kernels wrote)."""
    model = load_model(path, torch.float32, "cpu", progress=False)
    caches = bind_kv_cache(model.model, BlockPool(7, BLOCK_SIZE), torch.float32, "cpu")
    pools = _bind_states(model)
    ids = torch.tensor([(i * 7 + 3) % 131 for i in range(sum(PROMPT_LENS))])
    positions = torch.cat([torch.arange(n) for n in PROMPT_LENS])
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: False)
    prefill = RecurrentMetadata(torch.tensor(STATE_ROWS), torch.zeros(3, dtype=torch.bool))
    _forward(
        model,
        ids,
        positions,
        build_paged_metadata(TABLES, [0] * 3, PROMPT_LENS, BLOCK_SIZE, "cpu"),
        prefill,
    )

    width, snapshots = FORMS[form]
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: fused)
    monkeypatch.setattr(GatedDeltaNet, "fused_step", True)
    monkeypatch.setattr(Mamba2Mixer, "fused", True)
    if moe_kernels:
        monkeypatch.setattr(RoutingModule, "kernel", True)
        monkeypatch.setattr(RoutedExperts, "kernels", True)
    for norm in _block_norms(model) if norms_run is not None else ():
        norm.register_forward_hook(lambda *_: norms_run.append(1))
    step = RecurrentMetadata(
        torch.tensor(STATE_ROWS), torch.ones(3, dtype=torch.bool), snapshots=snapshots
    )
    meta = build_paged_metadata(TABLES, PROMPT_LENS, [width] * 3, BLOCK_SIZE, "cpu")
    ids = torch.tensor([(5 * i + 11) % 131 for i in range(3 * width)])
    positions = torch.cat([torch.arange(n, n + width) for n in PROMPT_LENS])
    backend = TritonAttentionBackend() if triton_attention else None
    logits = _forward(model, ids, positions, meta, step, backend)
    monkeypatch.undo()
    return logits, [torch.stack(c) for c in caches], pools


def _assert_same_step(got, want) -> None:
    """Two ``_served_step`` results: the same logits, KV caches and state pools, to float32 rounding."""
    (logits, caches, pools), (ref_logits, ref_caches, ref_pools) = got, want
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)
    for pool, ref_pool in zip(pools, ref_pools):
        for name in pool:
            torch.testing.assert_close(pool[name], ref_pool[name], rtol=1e-5, atol=1e-5)


def _block_norms(model) -> list:
    """The norms before each block's mixer and MLP (not the final norm, not attention's q/k norms)."""
    layers = model.model.layers
    if hasattr(layers[0], "input_layernorm"):
        return [
            n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)
        ]
    return [block.norm for block in layers]


# variant -> the block norms the fused step runs: a MoE reads its input materialised (one norm); Qwen3-Next's
# experts' combine adds their output to the stream and readies the next block's norm (layers/moe.py
# ReadyStream: no norm module), Nemotron-H's output is added and normalised by the next block's norm
# (another; after the last layer the final norm, not counted): Qwen3-Next's layers 0, 1 and 3, Nemotron-H's
# block 1
MATERIALISED = {"qwen3_next": 3, "qwen3_5": 0, "nemotron_h": 2}

# (variant, form): every variant and form, not every combination (the recurrent layers' step kernels take
# most of the time in the interpreter); with the tests below each recurrent mixer in every form: Qwen's
# DeltaNet decoding into the snapshots in the MoE and gated attention tests, Nemotron-H's Mamba2 verifying
# in fp8
CASES = [
    ("qwen3_next", "verify of 3"),
    ("qwen3_5", "decode into the row"),
    ("nemotron_h", "decode"),
    ("nemotron_h", "decode into the row"),
]


@pytest.mark.parametrize("variant, form", CASES)
def test_fused_hybrid_step_computes_what_the_eager_one_does(
    variant, form, checkpoints, monkeypatch
):
    """The fused step gives the eager step's logits, KV and states; the eager step runs every block norm once,
    the fused one folds them into the projections, all but a MoE's (``MATERIALISED``)."""
    path = checkpoints(variant)
    eager, fused = [], []
    want = _served_step(path, monkeypatch, False, form, eager)
    got = _served_step(path, monkeypatch, True, form, fused)
    assert any(p.abs().sum() > 0 for pool in want[2] for p in pool.values())
    _assert_same_step(got, want)
    layers = (
        len(HYBRIDS[variant][1].get("layers_block_type", ()))
        or HYBRIDS[variant][1]["num_hidden_layers"]
    )
    assert len(eager) == (layers if variant == "nemotron_h" else 2 * layers)
    assert len(fused) == MATERIALISED[variant]


# case -> (variant, format, the projections quantized, quantization config, scale dtype, form): Qwen3-Next-FP8's
# published layout (block FP8, bf16 scales; in_proj_ba and the norms, A_log, conv1d, dt_bias kept in bf16: the
# in-projections do not pack; in_proj_qkvz folds the norm, the step kernel projects b and a itself) and
# Qwen3.5-FP8's (in_proj_b and in_proj_a in bf16), Qwen3-Next with every projection in fp8 (as
# bench/families.py --quantized fp8 lays it out: they pack), in 8-row blocks (q/k/v pack in whole blocks), and
# Nemotron-H in ModelOpt's per-tensor FP8 (q/k/v pack as blocks of their rows' divisor, a scale each); a verify
# step (Mamba2's in fp8), Qwen3-Next's a decode (neither quantization nor packing follows the rows, Qwen3-Next's
# verify is the float32 test's above, and its DeltaNet layers' verify takes seconds in the interpreter)
QUANTIZED = {
    "qwen3_next_fp8": (
        "qwen3_next",
        "fp8_block",
        lambda name: is_projection(name) and "in_proj_ba" not in name,
        block_fp8_config((8, 16), modules_to_not_convert=["lm_head", "in_proj_ba"]),
        torch.bfloat16,
        "decode",
    ),
    # Qwen3.5-FP8's: in_proj_b and in_proj_a kept in bf16 beside fp8 q/k/v and z
    "qwen3_5_fp8": (
        "qwen3_5",
        "fp8_block",
        lambda name: (
            is_projection(name) and not any(p in name for p in ("in_proj_b.", "in_proj_a."))
        ),
        block_fp8_config((8, 16), modules_to_not_convert=["lm_head", "in_proj_b", "in_proj_a"]),
        torch.bfloat16,
        "decode",
    ),
    "qwen3_next_all_fp8": (
        "qwen3_next",
        "fp8_block",
        is_projection,
        block_fp8_config((8, 16)),
        torch.bfloat16,
        "decode",
    ),
    "nemotron_h_modelopt": (
        "nemotron_h",
        "fp8_tensor",
        is_projection,
        modelopt_config(["lm_head"]),
        torch.float32,
        "verify of 3",
    ),
}


@pytest.mark.parametrize("case", list(QUANTIZED))
def test_fused_fp8_hybrid_step_computes_what_the_eager_one_does(
    case, checkpoints, tmp_path, monkeypatch
):
    """The hybrids in fp8 on the fused stack: each block's fp8 input projection folds the input norm into its
    quantized product and its output projection adds the residual and readies the next norm in the product's
    store (layers/fused_projection.py ``_quantized_launch``); a step gives the eager step's logits, KV and
    states, every layer on the stack (no block norm of its own but a MoE's: ``MATERIALISED``)."""
    variant, method, quantize, config, scale_dtype, form = QUANTIZED[case]
    path, _ = write_quantized(checkpoints(variant), tmp_path, method, quantize, config, scale_dtype)
    want = _served_step(path, monkeypatch, False, form)
    finished = record_fp8_epilogues(monkeypatch)  # (input norm folded in, next norm readied)
    ba_in_step, step = [], deltanet_step_kernel.deltanet_step
    monkeypatch.setattr(
        deltanet_step_kernel,
        "deltanet_step",
        lambda rows, *a: ba_in_step.append(rows.ba_rows is not None) or step(rows, *a),
    )
    norms_run = []
    got = _served_step(path, monkeypatch, True, form, norms_run)
    _assert_same_step(got, want)
    assert len(norms_run) == MATERIALISED[variant]
    assert (True, False) in finished and (False, True) in finished, finished
    # b and a kept in bf16 beside fp8 projections: the step kernel projects them (no launch of their own), and
    # Qwen3.5-FP8's q/k/v and z pack (as many of the first in-projections as share a format)
    if case in ("qwen3_next_fp8", "qwen3_5_fp8"):
        assert ba_in_step and all(ba_in_step)
    else:
        assert not any(ba_in_step)
    model = load_model(path, torch.float32, "cpu", progress=False)
    packed = {
        len(m.in_proj.sizes) if m.in_proj is not None else 0
        for m in model.modules()
        if isinstance(m, GatedDeltaNet)
    }
    assert packed == {"qwen3_next_fp8": {0}, "qwen3_5_fp8": {2}, "qwen3_next_all_fp8": {2}}.get(
        case, set()
    )


# Qwen3-Next cut to two layers, a linear-attention then the full-attention one, each with a MoE block (the
# first's combine readies the next block's norm, the last's the final norm): the tests of one kind of block
# below leave the other layers out (each linear-attention layer runs its step kernel in the interpreter, most
# of a step's time)
TWO_LAYERS = dict(
    num_hidden_layers=2, layer_types=["linear_attention", "full_attention"], mlp_only_layers=[]
)


def test_moe_blocks_on_the_kernels_read_the_stream_through_their_norm(tmp_path, monkeypatch):
    """Qwen3-Next's MoE blocks on the routing and grouped kernels, fused: the post-attention norm folded into
    the routing kernel's logits and the gate/up kernel's products (layers/moe.py ``RowNorm``), the next
    block's norm readied by the combine (``ReadyStream``): the eager step's logits, KV and states, and not
    one block norm run as a module. (A shared expert twice the routed ones' width: fused with them as two
    shared slots, which the norm folding needs.)"""
    model = make_hybrid("qwen3_next", shared_expert_intermediate_size=24, **TWO_LAYERS)
    path = save_hybrid(model, tmp_path / "qwen3_next")
    want = _served_step(path, monkeypatch, False, "decode")
    fused_norms = []
    got = _served_step(path, monkeypatch, True, "decode", fused_norms, moe_kernels=True)
    _assert_same_step(got, want)
    assert fused_norms == []


@pytest.mark.parametrize("form,fp8", [("decode", False), ("verify of 3", False), ("decode", True)])
def test_gated_attention_takes_its_heads_from_one_kernel(form, fp8, tmp_path, monkeypatch):
    """Qwen3-Next's gated attention over a power-of-two head_dim, fused: q/k/v and the gate heads beside
    the query heads in one projection launch, the (1 + w) head norms, the partial RoPE and the cache write in
    the per-head kernel (layers/fused_projection.py ``norm_project_qkv_gate``, interleaved): the eager
    step's logits, KV and states. In fp8 (every projection, as bench/families.py --quantized fp8 lays
    Qwen3-Next out) the quantized product folds the input norm into its store and the heads kernel follows,
    where the eager attention (four launches more) ran before."""
    from outpace.layers import fused_projection

    path = save_hybrid(
        make_hybrid("qwen3_next", head_dim=16, **TWO_LAYERS), tmp_path / "qwen3_next"
    )
    if fp8:
        config = block_fp8_config((8, 16))
        path, _ = write_quantized(
            path, tmp_path, "fp8_block", is_projection, config, torch.bfloat16
        )
    want = _served_step(path, monkeypatch, False, form, triton_attention=True)
    calls, real = [], fused_projection.norm_project_qkv_gate
    monkeypatch.setattr(
        fused_projection,
        "norm_project_qkv_gate",
        lambda *a, **k: calls.append(k["interleaved"]) or real(*a, **k),
    )
    got = _served_step(path, monkeypatch, True, form, triton_attention=True)
    assert calls == [True]  # (the model's one full-attention layer)
    _assert_same_step(got, want)


def test_a_block_ends_fused_on_a_shard_that_reduces_itself_not_on_a_bias(monkeypatch):
    """A bias is not folded, and a row-parallel output projection whose caller sums its partial products
    (a mixture's shared expert) cannot end a block: ``block_fuses`` declines both; a row-parallel one that
    reduces itself ends it (projection, all-reduce, residual add: tests/distributed/test_tensor_parallel_fused.py)."""
    from outpace.distributed.group import RankGroup

    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: True)
    x, up, down = torch.zeros(2, 8), linear(8, 16), linear(16, 8)
    assert fused_decoder.block_fuses(x, up, down)
    assert not fused_decoder.block_fuses(x, up, linear(16, 8, bias=True))
    assert not fused_decoder.block_fuses(x, linear(8, 16, bias=True), down)
    down.group = RankGroup(rank=0, size=2)
    assert not fused_decoder.block_fuses(x, up, down)
    down.reduces = True
    assert fused_decoder.block_fuses(x, up, down)
