"""Gemma 4's norms and adds around the MLP as one launch each side (layers/sandwich_norms.py, kernels in
layers/sandwich_norm_kernels.py) against the torch path the layer took before (each norm and add its own
kernel): with and without the MoE block's two norms and second pre-norm, with and without the layer
scalar, over strided rows. In Triton's interpreter on CPU tensors (float32) without a GPU; bf16 on a GPU."""

import pytest
import torch

from helpers.kernel_checks import DEVICE, rand, rel
from outpace.layers.norm import Float32RMSNorm
from outpace.layers.sandwich_norm_kernels import after_attention_triton, after_mlp_triton
from outpace.layers.sandwich_norms import after_attention, after_mlp

DTYPES = [torch.float32] + ([torch.bfloat16] if DEVICE == "cuda" else [])


def norm(dim: int, seed: int, dtype) -> Float32RMSNorm:
    n = Float32RMSNorm(dim, 1e-6).to(DEVICE)
    with torch.no_grad():
        n.weight.copy_(rand(dim, seed=seed))
    return n.to(dtype)


def torch_path(fn, *args, **kwargs):
    """``fn``'s torch ops, also on a GPU: with autograd on it does not take the kernels (no backward)."""
    with torch.enable_grad():
        return fn(*args, **kwargs)


def close(got: torch.Tensor, expected: torch.Tensor, dtype) -> bool:
    # float32: only the reduction order differs; bf16: a last-bit rounding of a norm may differ
    return rel(got, expected) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("two", [False, True], ids=["dense", "moe"])
def test_after_attention_matches_torch(two, dtype, poisoned):
    dim = 72
    h = rand(5, dim, seed=1, dtype=dtype)
    attn = rand(5, 2 * dim, seed=2, dtype=dtype)[:, dim:]  # strided rows
    post, pre = norm(dim, 3, dtype), norm(dim, 4, dtype)
    pre2 = norm(dim, 5, dtype) if two else None
    got = after_attention_triton(h, attn, post, pre, pre2)
    expected = torch_path(after_attention, h, attn, post, pre, pre2)
    assert close(got[0], expected[0], dtype) and close(got[1], expected[1], dtype)
    if two:
        assert close(got[2], expected[2], dtype)
    else:
        assert got[2] is None and expected[2] is None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("moe", [False, True])
@pytest.mark.parametrize("scaled", [False, True])
def test_after_mlp_matches_torch(moe, scaled, dtype, poisoned):
    dim = 72
    h, mlp = rand(4, dim, seed=6, dtype=dtype), rand(4, dim, seed=7, dtype=dtype)
    post = norm(dim, 8, dtype)
    scale = (rand(1, seed=9, dtype=dtype) + 2.0) if scaled else None
    extra = (
        dict(
            routed=rand(4, dim, seed=10, dtype=dtype),
            post1=norm(dim, 11, dtype),
            post2=norm(dim, 12, dtype),
        )
        if moe
        else {}
    )
    got = after_mlp_triton(h, mlp, post, scale, **extra)
    expected = torch_path(after_mlp, h, mlp, post, scale, **extra)
    assert got.dtype == expected.dtype and close(got, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("next_offset", [0.0, 1.0])
def test_after_mlp_readies_the_stream_for_the_next_layers_norm(next_offset, dtype, poisoned):
    """With ``next_norm`` the kernel also writes the next layer's NormedRows (stream * (offset + w), sum of
    the stream's squares), as the fused projections' rows kernel makes them of the torch path's stream."""
    dim = 72
    h, mlp = rand(3, dim, seed=13, dtype=dtype), rand(3, dim, seed=14, dtype=dtype)
    post, scale = norm(dim, 15, dtype), rand(1, seed=16, dtype=dtype) + 2.0
    extra = dict(
        routed=rand(3, dim, seed=17, dtype=dtype),
        post1=norm(dim, 18, dtype),
        post2=norm(dim, 19, dtype),
    )
    following = Float32RMSNorm(dim, 1e-6, offset=next_offset).to(DEVICE)
    with torch.no_grad():
        following.weight.copy_(rand(dim, seed=20))
    following = following.to(dtype)
    got = after_mlp_triton(h, mlp, post, scale, next_norm=following, **extra)
    expected = torch_path(after_mlp, h, mlp, post, scale, next_norm=following, **extra)
    assert close(got.stream, expected.stream, dtype) and close(got.normed, expected.normed, dtype)
    assert got.sq_parts.shape == expected.sq_parts.shape == (1, 3)
    assert close(got.sq_parts, expected.sq_parts, dtype)
    plain = after_mlp_triton(
        h, mlp, post, scale, **extra
    )  # the stream is the one without next_norm
    assert torch.equal(got.stream, plain)


def test_norms_of_other_offsets_are_refused():
    dim = 16
    h = rand(2, dim, seed=1)
    gemma3 = Float32RMSNorm(dim, 1e-6, offset=1.0).to(DEVICE)
    with pytest.raises(ValueError, match="one offset"):
        after_mlp_triton(h, h, gemma3, routed=h, post1=norm(dim, 2, torch.float32), post2=gemma3)
