"""Where the gated paged-attention store (attention/triton_kernels.py ``out_gate``) and attention followed by
``sigmoid_gate`` differ in bf16 on the GPU (tests/kernels/test_gated_attention.py ``test_bf16_8b_shape``: four
verify cases differed on the H200, gpu_2026-12-01f call 3): per case, whether the ungated output repeats
itself, how many elements differ and by how many bf16 ulps, with the gate as a strided view and contiguous.

    PYTHONPATH=.:tests python benchmarks/scripts/diag_gated_attention_bits.py
"""

import torch
from kernels.test_gated_attention import make_case, make_gate, run  # noqa: E402

from outpace.attention.context import forward_settings
from outpace.layers.activation import sigmoid_gate


def ulps(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance between a and b (bf16) in units of the last place."""
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    return int((ia - ib).abs().max())


def main() -> None:
    cached = [3000, 700, 1500, 64, 2048, 33, 900, 1200]
    print(
        f"{'gate':<15} {'case':<8} {'splits':<9} {'plain repeats':>13} {'differ':>7} {'ulps':>5} {'contiguous gate: differ':>23}"
    )
    for kind in ("head-packed", "element-packed"):
        for new, name in (([1] * 8, "decode"), ([4] * 8, "verify")):
            for invariant, splits in ((False, 1), (False, 8), (True, None)):
                case = make_case(
                    cached,
                    new,
                    block_size=16,
                    head_dim=128,
                    heads=32,
                    kv_heads=8,
                    dtype=torch.bfloat16,
                    seed=9,
                )
                gate = make_gate(kind, case, torch.float32, seed=4)
                with forward_settings(batch_invariant=invariant):
                    gated, plain = run(case, gate, num_splits=splits)
                    _, plain2 = run(case, gate, num_splits=splits)
                    gated_c, _ = run(case, gate.contiguous(), num_splits=splits)
                per_head = gate if gate.dim() == 3 else gate[..., None]
                ref = sigmoid_gate(plain, per_head)
                diff = int((gated != ref).sum())
                diff_c = int((gated_c != sigmoid_gate(plain, per_head.contiguous())).sum())
                print(
                    f"{kind:<15} {name:<8} {str(splits if not invariant else 'invariant'):<9} "
                    f"{str(torch.equal(plain, plain2)):>13} {diff:>7} {ulps(gated, ref):>5} {diff_c:>23}"
                )


if __name__ == "__main__":
    main()
