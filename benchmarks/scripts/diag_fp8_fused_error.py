"""How far a block-FP8 Qwen3-MoE's decode forward lies from its dequantized twin's in float32, on the eager and the
fused few-row paths (GPU): a small Qwen3-30B-A3B-FP8 layout (whole 128 x 128 blocks, bf16 scales), mixture layers
and all-dense, one decode forward after an eager prefill (tests/helpers/fused_decode.py). Prints the relative
error of each path's logits against the float32 twin's and of the fused against the eager; what
tests/gpu/test_fp8_fused_stack_gpu.py's bound rests on.

    PYTHONPATH=.:tests python3 benchmarks/scripts/diag_fp8_fused_error.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from helpers.fused_decode import decode_forward
from helpers.hf_models import save_hf_model
from helpers.quantized_checkpoints import block_fp8_config, is_projection, write_quantized
from helpers.qwen3_moe_models import BLOCK_128, make_qwen3_moe
from outpace.layers import fused_decoder


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def main() -> None:
    config = block_fp8_config((128, 128), modules_to_not_convert=["lm_head"])
    for name, layers in (("mixture", {}), ("dense", dict(mlp_only_layers=[0, 1, 2, 3]))):
        tmp = Path(tempfile.mkdtemp())
        src = save_hf_model(make_qwen3_moe("renormalised", **BLOCK_128, **layers), tmp / "bf16")
        q_dir, twin = write_quantized(src, tmp, "fp8_block", is_projection, config, torch.bfloat16)
        patch = pytest.MonkeyPatch()
        reference, _ = decode_forward(twin, patch, torch.float32, lambda x, w: False)
        eager, _ = decode_forward(q_dir, patch, torch.bfloat16, lambda x, w: False)
        fused, _ = decode_forward(q_dir, patch, torch.bfloat16, fused_decoder.fusable_rows)
        print(
            f"{name}: eager {relative(eager, reference):.4f}, fused {relative(fused, reference):.4f} from the"
            f" float32 twin; fused from eager {relative(fused, eager):.4f}"
        )


if __name__ == "__main__":
    main()
