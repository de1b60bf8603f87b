"""Every drafter on the zoo target (zoo/tinypy) by name, as the feature tests parametrize over them, the device those
tests run on (fp32 on the CPU by default; OUTPACE_TEST_DEVICE=cuda runs the same checks on a GPU) and their LLM."""

from __future__ import annotations

import os
from pathlib import Path

from outpace import LLM
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"
TEST_DEVICE = os.environ.get("OUTPACE_TEST_DEVICE", "cpu")


def zoo_drafters(chain_steps: int, tree: tuple[int, int, int]) -> dict[str, SpeculativeConfig]:
    """name -> config: an EAGLE3 chain of ``chain_steps``, an EAGLE3 tree of (steps, topk, draft tokens), the
    target's 3 MTP layers, DFlash's block of 8, the standalone draft and n-gram (4 drafts each)."""
    steps, topk, tokens = tree
    eagle3 = str(ZOO / "tinypy-eagle3")
    return {
        "eagle3-chain": SpeculativeConfig("eagle3", eagle3, num_steps=chain_steps),
        "eagle3-tree": SpeculativeConfig(
            "eagle3", eagle3, num_steps=steps, topk=topk, num_draft_tokens=tokens
        ),
        "mtp": SpeculativeConfig("mtp", num_steps=3),
        "dflash": SpeculativeConfig("dflash", str(ZOO / "tinypy-dflash"), num_steps=7),
        "draft": SpeculativeConfig("draft", str(ZOO / "tinypy-draft"), num_steps=4),
        "ngram": SpeculativeConfig("ngram", num_steps=4),
    }


def zoo_llm(spec: SpeculativeConfig | None = None, **engine_kwargs) -> LLM:
    """The feature tests' LLM: zoo/tinypy in fp32 on ``TEST_DEVICE``, 256 KV blocks, 8 requests at a time (unless
    ``engine_kwargs`` say otherwise), drafting with ``spec`` (None: plain decoding)."""
    kwargs = {"num_kv_blocks": 256, "max_num_seqs": 8, **engine_kwargs}
    return LLM(
        str(ZOO / "tinypy"),
        device=TEST_DEVICE,
        dtype="float32",
        speculative=spec or SpeculativeConfig(),
        **kwargs,
    )
