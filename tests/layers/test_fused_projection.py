"""The fused few-row projections compute what the unfused chain of modules computes. On the CPU the
kernels run in Triton's interpreter (float32); on the GPU in bf16 at the Llama-3.1-8B shapes."""

import pytest
import torch
import torch.nn.functional as F

from helpers.fused_decode import decode_forward
from outpace.layers.fused_projection import (
    _launch_grid,
    _splits_heads,
    fused_rows_apply,
    norm_project,
    norm_project_qkv,
    norm_project_qkv_gate,
    norm_project_swiglu,
    project_add,
    project_add_normed,
    project_rows,
    project_swiglu,
)
from outpace.layers.fused_rows_kernel import PLAIN, QKV
from outpace.layers.norm import rms_norm_f32, rms_norm_torch
from outpace.layers.normed_rows import embed_norm_pair, normed_rows
from outpace.layers.rotary import RotaryEmbedding, rotary_torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5


def _rand(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _close(out, ref, tol=1e-5):
    out, ref = out.double().cpu(), ref.double().cpu()
    err = ((out - ref).norm() / ref.norm()).item()
    assert err < tol, err


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (16, 256, 64), (7, 40, 200)])
def test_norm_project_is_rms_norm_then_linear(m, k, n):
    x, nw, w = _rand(m, k, seed=1) * 3, _rand(k, seed=2), _rand(n, k, seed=3)
    ref = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], w.double())
    _close(norm_project(normed_rows(x.to(DEVICE), nw.to(DEVICE)), EPS, w.to(DEVICE)), ref)


def test_norm_project_can_write_another_dtype():
    x, nw, w = _rand(3, 64, seed=4), _rand(64, seed=5), _rand(40, 64, seed=6)
    out = norm_project(
        normed_rows(x.to(DEVICE), nw.to(DEVICE)), EPS, w.to(DEVICE), out_dtype=torch.float64
    )
    assert out.dtype == torch.float64


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (5, 64, 520)])
def test_project_add_normed_readies_the_stream_for_the_next_norm(m, k, n):
    """The stream it writes, normed by the projection after it, is RMSNorm(stream) @ W.T."""
    x, w, res, nw = (
        _rand(m, k, seed=21),
        _rand(n, k, seed=22),
        _rand(m, n, seed=23),
        _rand(n, seed=24),
    )
    w_next = _rand(30, n, seed=25)
    rows = project_add_normed(x.to(DEVICE), w.to(DEVICE), res.to(DEVICE), nw.to(DEVICE))
    stream = res.double() + F.linear(x.double(), w.double())
    _close(rows.stream, stream)
    _close(rows.normed, stream * nw.double())
    _close(rows.sq_parts.sum(0), stream.pow(2).sum(-1))
    ref = F.linear(rms_norm_torch(stream, nw.double(), EPS)[0], w_next.double())
    _close(norm_project(rows, EPS, w_next.to(DEVICE)), ref)


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (9, 512, 33)])
def test_project_add_adds_the_residual(m, k, n):
    x, w, res = _rand(m, k, seed=7), _rand(n, k, seed=8), _rand(m, n, seed=9)
    out = project_add(x.to(DEVICE), w.to(DEVICE), res.to(DEVICE))
    _close(out, res.double() + F.linear(x.double(), w.double()))


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (16, 96, 2048), (3, 520, 33)])
def test_project_rows_is_the_plain_product(m, k, n):
    x, w = _rand(m, k, seed=11), _rand(n, k, seed=12)
    _close(project_rows(x.to(DEVICE), w.to(DEVICE)), F.linear(x.double(), w.double()))


@pytest.mark.parametrize("m,k,n", [(1, 300, 70), (7, 40, 200)])
def test_relu2_epilogue_is_the_activation_after_the_projection(m, k, n):
    """Nemotron-H's up_proj and relu2 in one kernel: relu(.)^2 of the product, normed or plain; the
    activation's zeros and squares (a kernel without the epilogue, or relu alone, fails this)."""
    x, nw, w = _rand(m, k, seed=41) * 3, _rand(k, seed=42), _rand(n, k, seed=43)
    normed = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], w.double())
    rows = normed_rows(x.to(DEVICE), nw.to(DEVICE))
    _close(norm_project(rows, EPS, w.to(DEVICE), relu2=True), F.relu(normed).square())
    plain = F.linear(x.double(), w.double())
    _close(project_rows(x.to(DEVICE), w.to(DEVICE), relu2=True), F.relu(plain).square())
    assert (plain < 0).any()  # (the zeros are exercised)


@pytest.mark.parametrize("m,k,inter,act", [(1, 300, 70, "silu"), (9, 96, 33, "gelu_pytorch_tanh")])
def test_project_swiglu_is_the_gated_product(m, k, inter, act):
    from outpace.layers.activation import ACTIVATIONS

    x, w = _rand(m, k, seed=13), _rand(2 * inter, k, seed=14)
    gate, up = F.linear(x.double(), w.double()).split(inter, dim=1)
    out = project_swiglu(x.to(DEVICE), w.to(DEVICE), act)
    _close(out, ACTIVATIONS[act](gate) * up)


def test_strided_rows_are_read_correctly():
    x = _rand(5, 128, seed=10)[:, :64]  # row stride 128
    w, res = _rand(48, 64, seed=11), _rand(5, 48, seed=12)
    _close(
        project_add(x.to(DEVICE), w.to(DEVICE), res.to(DEVICE)),
        res.double() + F.linear(x.double(), w.double()),
    )


@pytest.mark.parametrize("m,k,inter", [(1, 96, 80), (12, 64, 200)])
def test_norm_project_swiglu_is_norm_gate_up_then_silu_mul(m, k, inter):
    x, nw, w = _rand(m, k, seed=13), _rand(k, seed=14), _rand(2 * inter, k, seed=15)
    gate, up = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], w.double()).chunk(
        2, dim=-1
    )
    _close(
        norm_project_swiglu(normed_rows(x.to(DEVICE), nw.to(DEVICE)), EPS, w.to(DEVICE)),
        F.silu(gate) * up,
    )


def test_norm_project_swiglu_of_an_input_already_normalised():
    """A tensor is read as the normalised input (``NormalisedRows.x`` after a row-parallel block): no norm."""
    x, w = _rand(3, 96, seed=16), _rand(2 * 40, 96, seed=17)
    gate, up = F.linear(x.double(), w.double()).chunk(2, dim=-1)
    _close(norm_project_swiglu(x.to(DEVICE), EPS, w.to(DEVICE)), F.silu(gate) * up)


@pytest.mark.parametrize(
    "qk_norm,split_heads,rotated_part",
    [(False, None, 1), (True, False, 1), (True, True, 1), (True, None, 2), (True, None, 4)],
    ids=["llama", "qk_norm", "qk_norm_split_heads", "half_rotated", "quarter_rotated"],
)
@pytest.mark.parametrize(
    "m,heads,kv_heads,head_dim", [(1, 4, 2, 32), (11, 6, 2, 16), (16, 2, 2, 64), (3, 4, 2, 128)]
)
def test_norm_project_qkv_rotates_and_writes_the_cache(
    m, heads, kv_heads, head_dim, qk_norm, split_heads, rotated_part
):
    """Partial rotary (rotated_part 2, 4: Step-3.5's full-attention layers turn half of each head,
    Qwen3-Next's a quarter) takes the per-head kernel: the first head_dim / rotated_part dimensions
    turned in neox pairs, the rest passed."""
    k_in, q_size, kv_size = 72, heads * head_dim, kv_heads * head_dim
    x, nw = _rand(m, k_in, seed=16), _rand(k_in, seed=17)
    w = _rand(q_size + 2 * kv_size, k_in, seed=18)
    qn, kn = _rand(head_dim, seed=21), _rand(head_dim, seed=22)
    rotary = RotaryEmbedding(
        head_dim // rotated_part,
        4096,
        10000.0,
        {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 256},
    )
    positions = torch.randint(0, 4096, (m,), generator=torch.Generator().manual_seed(19))
    num_blocks, block_size = 6, 4
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(20))[:m]
    k_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), 7.0)
    v_cache = torch.full((num_blocks, block_size, kv_heads, head_dim), -7.0)

    qkv = F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], w.double())
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q, k = q.reshape(m, heads, head_dim), k.reshape(m, kv_heads, head_dim)
    if qk_norm:
        q, k = rms_norm_torch(q, qn.double(), EPS)[0], rms_norm_torch(k, kn.double(), EPS)[0]
    q_ref, k_ref = rotary_torch(positions, q, k, rotary.cos.double(), rotary.sin.double())
    k_cache_ref, v_cache_ref = (
        k_cache.double().view(-1, kv_size),
        v_cache.double().view(-1, kv_size),
    )
    k_cache_ref[slots], v_cache_ref[slots] = k_ref.reshape(m, kv_size), v

    dev = [t.to(DEVICE) for t in (k_cache, v_cache)]
    out = norm_project_qkv(
        normed_rows(x.to(DEVICE), nw.to(DEVICE)),
        EPS,
        w.to(DEVICE),
        head_dim,
        q_size,
        positions.to(DEVICE),
        rotary.cos.to(DEVICE),
        rotary.sin.to(DEVICE),
        *dev,
        slots.to(DEVICE),
        qk_norm=(qn.to(DEVICE), kn.to(DEVICE), EPS) if qk_norm else None,
        split_heads=split_heads,
    )
    _close(out, q_ref.reshape(m, q_size))
    _close(
        dev[0].view(-1, kv_size), k_cache_ref
    )  # the tokens' slots hold k; every other slot is untouched
    _close(dev[1].view(-1, kv_size), v_cache_ref)

    # k and v alone (q_size 0: a drafter's context rows), from rows that are already normalised
    kv_only = [torch.zeros_like(c) for c in dev]
    normed_x = rms_norm_torch(x.double(), nw.double(), EPS)[0].float()
    norm_project_qkv(
        normed_x.to(DEVICE),
        0.0,
        w[q_size:].to(DEVICE),
        head_dim,
        0,
        positions.to(DEVICE),
        rotary.cos.to(DEVICE),
        rotary.sin.to(DEVICE),
        *kv_only,
        slots.to(DEVICE),
        qk_norm=(kn.to(DEVICE), kn.to(DEVICE), EPS) if qk_norm else None,
        split_heads=split_heads,
    )
    _close(kv_only[0].view(-1, kv_size)[slots], k_ref.reshape(m, kv_size))
    _close(kv_only[1].view(-1, kv_size)[slots], v)


@pytest.mark.parametrize("interleaved", [False, True], ids=["gate_after_v", "gate_beside_q"])
@pytest.mark.parametrize("normed", [True, False], ids=["normed_rows", "normalised_tensor"])
@pytest.mark.parametrize(
    "m,heads,kv_heads,head_dim,rotated_part",
    [(1, 6, 2, 32, 1), (7, 4, 2, 16, 2), (13, 3, 1, 64, 4)],
)
def test_norm_project_qkv_gate_is_qkv_and_the_gate_rows(
    m, heads, kv_heads, head_dim, rotated_part, normed, interleaved
):
    """An attention output gate's rows in q/k/v's projection launch: after v (Step-3.5's head-wise gate,
    one row a head), or beside each q head (Qwen3-Next's q_proj: [q head | gate head] per head, as wide as
    q): q, the cache writes and the gate's products are those of ``norm_project_qkv`` over [q | k | v] and
    a plain product of the gate's rows."""
    k_in, q_size, kv_size = 72, heads * head_dim, kv_heads * head_dim
    gate_size = q_size if interleaved else heads
    x, nw = _rand(m, k_in, seed=30), _rand(k_in, seed=31)
    qkv_w, gate_w = _rand(q_size + 2 * kv_size, k_in, seed=32), _rand(gate_size, k_in, seed=37)
    if interleaved:  # [q head 0 | gate head 0 | q head 1 | ... | k | v]
        q_heads, gate_heads = (
            qkv_w[:q_size].view(heads, 1, head_dim, k_in),
            gate_w.view(heads, 1, -1, k_in),
        )
        w = torch.cat([torch.cat([q_heads, gate_heads], 1).view(-1, k_in), qkv_w[q_size:]])
    else:
        w = torch.cat([qkv_w, gate_w])
    qn, kn = _rand(head_dim, seed=33), _rand(head_dim, seed=34)
    rotary = RotaryEmbedding(head_dim // rotated_part, 512, 10000.0)
    positions = torch.randint(0, 512, (m,), generator=torch.Generator().manual_seed(35))
    slots = torch.randperm(6 * 4, generator=torch.Generator().manual_seed(36))[:m].to(DEVICE)
    x_normed = rms_norm_torch(x.double(), nw.double(), EPS)[0]
    rows = normed_rows(x.to(DEVICE), nw.to(DEVICE)) if normed else x_normed.float().to(DEVICE)
    tables = (positions.to(DEVICE), rotary.cos.to(DEVICE), rotary.sin.to(DEVICE))
    qk_norm = (qn.to(DEVICE), kn.to(DEVICE), EPS)
    caches, ref_caches = (
        [torch.zeros(6, 4, kv_heads, head_dim, device=DEVICE) for _ in range(2)] for _ in range(2)
    )
    q, gate = norm_project_qkv_gate(
        rows,
        EPS,
        w.to(DEVICE),
        head_dim,
        q_size,
        gate_size,
        *tables,
        *caches,
        slots,
        qk_norm=qk_norm,
        interleaved=interleaved,
    )
    q_ref = norm_project_qkv(
        rows,
        EPS,
        qkv_w.to(DEVICE),
        head_dim,
        q_size,
        *tables,
        *ref_caches,
        slots,
        qk_norm=qk_norm,
        split_heads=True,
    )
    _close(q, q_ref)
    for cache, ref in zip(caches, ref_caches):
        _close(cache, ref)
    gate_ref = F.linear(x_normed, gate_w.double())
    assert gate.dtype == torch.float32
    _close(gate, gate_ref.view(m, heads, head_dim) if interleaved else gate_ref)


def test_norm_project_writes_into_a_given_tensor():
    x, nw, w = _rand(3, 64, seed=27), _rand(64, seed=28), _rand(40, 64, seed=29)
    rows = normed_rows(x.to(DEVICE), nw.to(DEVICE))
    buffer = torch.full((5, 40), float("nan"), device=DEVICE)
    out = norm_project(rows, EPS, w.to(DEVICE), out_dtype=torch.float32, out=buffer[1:4])
    assert out.data_ptr() == buffer[1:4].data_ptr()
    _close(buffer[1:4], F.linear(rms_norm_torch(x.double(), nw.double(), EPS)[0], w.double()))
    assert buffer[0].isnan().all() and buffer[4].isnan().all()
    with pytest.raises(ValueError, match="norm_project writes"):
        norm_project(rows, EPS, w.to(DEVICE), out_dtype=torch.float32, out=buffer[:2])


@pytest.mark.parametrize(
    "eps_h, offsets",
    [(0.5, (0.0, 0.0)), (EPS, (1.0, 0.25))],
    ids=["eps apart", "offsets apart"],
)
def test_embed_norm_pair_is_both_norms_concatenated(eps_h, offsets):
    """EAGLE3's and MTP layers' input: [RMSNorm(embedding[ids]) | RMSNorm(hidden)] in one kernel, each norm
    with its own eps (a widened Gemma zoo's hidden norm has a rescaled one: large here) and its own offset
    (Qwen's MTP norms scale by 1 + w, models/drafts/mtp.py ``mtp_input``), so a swap, a shared eps or a
    dropped offset fails."""
    emb, hidden = _rand(50, 40, seed=23), _rand(3, 40, seed=24)
    we, wh, ids = _rand(40, seed=25), _rand(40, seed=26), torch.tensor([7, 0, 49])
    expected = torch.cat(
        [
            rms_norm_f32(emb[ids].double(), we.double(), EPS, offsets[0]),
            rms_norm_f32(hidden.double(), wh.double(), eps_h, offsets[1]),
        ],
        dim=-1,
    )
    out = embed_norm_pair(
        ids.to(DEVICE),
        emb.to(DEVICE),
        (we.to(DEVICE), EPS, offsets[0]),
        hidden.to(DEVICE),
        (wh.to(DEVICE), eps_h, offsets[1]),
    )
    _close(out, expected)


@pytest.mark.parametrize("processors", [4, 132])
@pytest.mark.parametrize(
    "n_out,epilogue,whole",
    [
        (70, PLAIN, 1),
        (4096, PLAIN, 1),
        (128256, PLAIN, 1),
        (14336, QKV, 1),
        (3072, QKV, 1),
        (80, QKV, 8),
        (3072, QKV, 64),
    ],
)
def test_grid_gives_every_output_to_one_program_evenly(
    n_out, epilogue, whole, processors, monkeypatch
):
    from outpace.layers import fused_projection

    monkeypatch.setattr(fused_projection, "num_sms", lambda device: processors)
    grid = _launch_grid(n_out, epilogue.value, 2 * n_out, torch.device("cpu"), whole)
    owner = torch.zeros(n_out, dtype=torch.long)
    for p in range(grid.programs):
        own_end = min(p * grid.outs + grid.outs, n_out)
        for sub in range(grid.subs):
            start = p * grid.outs + sub * grid.chunk
            assert start % whole == 0  # a sub-tile starts on a head (per-head norms)
            owner[start : min(start + grid.chunk, own_end)] += 1
    assert (owner == 1).all()
    assert grid.chunk <= grid.block_n and grid.block_n % whole == 0
    assert grid.programs <= max(
        processors, n_out // 16
    )  # one program an SM, unless outputs are few
    if n_out >= 16 * processors:  # no program has more than its share, to the sub-tile
        assert grid.outs <= -(-n_out // processors) + whole - 1


@pytest.mark.parametrize(
    "weight_rows,head_dim,splits",
    [
        (8192, 256, True),  # Gemma-3-12B: 32 programs of a head
        (8192, 512, True),  # a Gemma 4 global layer's width at head_dim 512: 16
        (6144, 128, True),  # Qwen3-8B: 48
        (10240, 128, False),  # Qwen3-32B: 80 of 132
    ],
)
def test_qkv_heads_split_where_whole_heads_leave_the_sms_idle(
    weight_rows, head_dim, splits, monkeypatch
):
    from outpace.layers import fused_projection

    monkeypatch.setattr(fused_projection, "num_sms", lambda device: 132)
    assert _splits_heads(weight_rows, head_dim, torch.device("cpu")) == splits


def test_applies_only_to_few_half_precision_rows_on_the_gpu_without_grad():
    w = torch.zeros(8, 4, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert not fused_rows_apply(torch.zeros(2, 4, dtype=torch.bfloat16), w)  # the CPU
        if torch.cuda.is_available():
            assert fused_rows_apply(
                torch.zeros(16, 4, dtype=torch.bfloat16, device="cuda"), w.cuda()
            )
            assert not fused_rows_apply(
                torch.zeros(17, 4, dtype=torch.bfloat16, device="cuda"), w.cuda()
            )
            assert not fused_rows_apply(torch.zeros(2, 4, device="cuda"), w.float().cuda())


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_bf16_at_the_8b_shapes_matches_the_unfused_chain(pdl):
    hidden, inter = 4096, 14336
    x = torch.randn(6, hidden, device="cuda", dtype=torch.bfloat16)
    nw = 1 + 0.1 * torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    w = 0.02 * torch.randn(2 * inter, hidden, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        gate, up = F.linear(rms_norm_torch(x, nw, EPS)[0].float(), w.float()).chunk(2, dim=-1)
        out = norm_project_swiglu(normed_rows(x, nw), EPS, w, pdl=pdl)
    _close(out.float(), F.silu(gate) * up, tol=1e-2)


def _decode(tmp_path, monkeypatch, dtype, fusable):
    """``decode_forward`` of a random two-layer Llama."""
    from helpers.spec_models import random_llama

    path = tmp_path / "t"
    if not path.exists():
        random_llama(path, vocab_size=50, seed=0, std=0.2)
    return decode_forward(path, monkeypatch, dtype, fusable)


def fused_and_unfused(path, monkeypatch) -> tuple:
    """The float32 decode forward (``decode_forward``) of the checkpoint at ``path`` with the fused path forced
    on (on the CPU the kernels run in the interpreter), asserted taken, and with it off: ((logits, caches),
    (logits, caches))."""
    calls = []
    fused = decode_forward(path, monkeypatch, torch.float32, lambda x, w: calls.append(x) or True)
    assert calls, "the fused path did not run"
    return fused, decode_forward(path, monkeypatch, torch.float32, lambda x, w: False)


def test_fused_decoder_layers_compute_what_the_unfused_ones_do(tmp_path, monkeypatch):
    """The model's fused path gives the unfused path's logits in float32 and writes the same KV into the
    cache."""
    from helpers.spec_models import random_llama

    random_llama(tmp_path / "t", vocab_size=50, seed=0, std=0.2)
    (logits, caches), (ref_logits, ref_caches) = fused_and_unfused(tmp_path / "t", monkeypatch)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
    for c, r in zip(caches, ref_caches):
        torch.testing.assert_close(c, r, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_bf16_fused_decode_forward_on_the_gpu_matches_the_unfused_one(tmp_path, monkeypatch):
    """The real conditions choose the fused path for a bf16 decode batch on the GPU; its logits and
    cache agree with the unfused path's to bf16 precision."""
    import outpace.layers.fused_decoder as fused_decoder

    calls, real = [], fused_decoder.fusable_rows
    ref_logits, ref_caches = _decode(tmp_path, monkeypatch, torch.bfloat16, lambda x, w: False)
    logits, caches = _decode(
        tmp_path, monkeypatch, torch.bfloat16, lambda x, w: calls.append(real(x, w)) or calls[-1]
    )
    assert calls and all(calls), "the fused path was not chosen"
    _close(logits, ref_logits.double().cpu(), tol=2e-2)
    for c, r in zip(caches, ref_caches):
        _close(c, r.double().cpu(), tol=2e-2)


INTERPRETER_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="runs the kernels on CPU tensors in Triton's "
    "interpreter; on the GPU the bf16 tests here check the real dispatch",
)


def _speculate(spec, max_tokens: int) -> list:
    """Greedy speculation on the zoo target with the Triton attention backend, two prompts: each
    request's tokens and its acceptance per draft position."""
    from outpace import LLM, SamplingParams

    llm = LLM("zoo/tinypy", speculative=spec, attention_backend="triton", max_num_seqs=2)
    outs = llm.generate(
        ["def add(a, b):", "class Stack:"],
        SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True),
    )
    return [(o.token_ids, o.spec_metrics.acceptance_rate_per_position) for o in outs]


@INTERPRETER_ONLY
def test_fused_eagle3_chain_gives_the_unfused_output(monkeypatch):
    """EAGLE3 speculation on the zoo pair with every few-row forward fused (target decode and verify,
    the draft layer and both heads; forced on here, the kernels in the interpreter on the CPU): the
    same tokens and the same accepted drafts (the draft's proposals) as without fusion."""
    import outpace.layers.fused_decoder as fused_decoder
    from outpace.config import SpeculativeConfig

    spec = SpeculativeConfig(method="eagle3", draft="zoo/tinypy-eagle3", num_steps=3)
    expected = _speculate(spec, 3)  # (few tokens: every forward runs in the interpreter)
    calls, real = [], fused_decoder.fused_attention_output_and_mlp
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: x.shape[0] <= 16)
    # the draft layer's call is the one without a next norm (a target layer hands its stream to the next norm)
    monkeypatch.setattr(
        fused_decoder,
        "fused_attention_output_and_mlp",
        lambda *a: calls.append(a[-1] is None) or real(*a),
    )
    assert _speculate(spec, 3) == expected
    assert any(calls), "the draft layer's fused path did not run"


@INTERPRETER_ONLY
def test_fused_dflash_gives_the_unfused_output(monkeypatch):
    """DFlash speculation with every few-row forward fused, the draft's Qwen3-style layers (per-head
    q/k norms in the q/k/v kernel) and its context writes (k/v only) included: the same tokens and
    the same accepted drafts as without fusion."""
    import outpace.layers.fused_decoder as fused_decoder
    import outpace.layers.fused_projection as fp
    from outpace.config import SpeculativeConfig

    spec = SpeculativeConfig(method="dflash", draft="zoo/tinypy-dflash", num_steps=7)
    expected = _speculate(spec, 3)
    calls, real = [], fp.norm_project_qkv
    monkeypatch.setattr(fused_decoder, "fusable_rows", lambda x, w: x.shape[0] <= 16)
    monkeypatch.setattr(
        fp,
        "norm_project_qkv",
        lambda *a, **kw: calls.append((a[4], kw["qk_norm"] is not None)) or real(*a, **kw),
    )
    assert _speculate(spec, 3) == expected
    assert (0, True) in calls, "no fused context write (k/v only, with the k norm)"
    assert any(q > 0 and qk for q, qk in calls), "no fused draft layer with q/k norms"


def test_the_fused_path_scales_ministral3_queries_as_the_unfused_one(tmp_path, monkeypatch):
    """Ministral 3's query scale by position (layers/rotary.py ``query_scale``) after the fused q/k/v kernel
    (layers/fused_decoder.py ``project_fused``): the decode forward's logits equal the unfused path's, at
    positions past several of the scale's steps (q_proj sharpened so that the scale shows)."""
    from helpers.hf_models import make_hf_model, save_hf_model

    hf = make_hf_model("ministral3", head_dim=8)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(8)
    (logits, _), (ref_logits, _) = fused_and_unfused(
        save_hf_model(hf, tmp_path / "m3"), monkeypatch
    )
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-4)
