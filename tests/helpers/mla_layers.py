"""A random multi-head latent attention layer for the MLA kernel tests (layers/mla.py): weights of unit-scale
products, norm weights about 1, always the absorbed form."""

from __future__ import annotations

import torch

from outpace.layers.mla import MLAShape, MultiHeadLatentAttention
from outpace.layers.rotary import RotaryEmbedding


def make_layer(shape: MLAShape, interleaved: bool, device: str) -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    # tables past the tests' 4000 positions: the fused kernels read cos/sin at a token's position unchecked
    rotary = RotaryEmbedding(shape.qk_rope_head_dim, 4096 + 64, 10000.0, interleaved=interleaved)
    layer = MultiHeadLatentAttention(shape, rotary).to(device)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "layernorm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    layer.expand_min_query_len = 10**6  # always absorbed
    return layer
