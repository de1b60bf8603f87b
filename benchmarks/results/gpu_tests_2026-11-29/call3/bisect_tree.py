"""Which path breaks test_hybrid_greedy_tokens_on_the_gpu_equal_the_cpus' EAGLE3 tree on the GPU: run it with
the fused recurrent steps or the MoE kernels switched off (argv[1]: none, recurrent or moe)."""

import sys

import pytest

from outpace.layers.gated_deltanet import GatedDeltaNet
from outpace.layers.mamba2 import Mamba2Mixer
from outpace.layers.moe import RoutedExperts, Router

if sys.argv[1] == "recurrent":
    GatedDeltaNet.fused_step, Mamba2Mixer.fused = False, False
elif sys.argv[1] == "moe":
    RoutedExperts.kernels = False
    Router.uses_kernel = lambda self, x: False
code = pytest.main(
    [
        "-q",
        "-p",
        "no:cacheprovider",
        "--tb=line",
        "tests/kernels/test_hybrid_kernels.py",
        "-k",
        "greedy_tokens_on_the_gpu",
    ]
)
print("bisect", sys.argv[1], "exit", int(code))
