"""The sampling tests' tiny Llama target (5 tokens, so that the joint of three tokens stays small enough to
test), its drafts of every kind, the prompt, the sampling parameters and the speculative configs."""

import torch

from helpers.spec_models import make_dflash_draft, make_eagle3_draft, random_llama
from outpace import SamplingParams
from outpace.config import SpeculativeConfig

VOCAB, PROMPT, LENGTH, TRIALS = 5, [0, 1, 2, 3, 4, 1], 3, 6000
PARAMS = SamplingParams(temperature=0.8, top_k=4, top_p=0.95, max_tokens=LENGTH, ignore_eos=True)


def save_sampling_models(root) -> dict:
    """name -> path: the target (with 2 MTP layers), a standalone, an EAGLE3 and a DFlash draft, and a token
    map of three of the five tokens (out of order) for MTP and DFlash drafts."""
    target = random_llama(root / "target", VOCAB, seed=0, mtp_layers=2)
    torch.save([3, 0, 1], root / "token_map.pt")
    return {
        "token_map": root / "token_map.pt",
        "target": target,
        "draft": random_llama(root / "draft", VOCAB, seed=1),
        "eagle3": make_eagle3_draft(target, root / "eagle3", draft_vocab_size=4, aux_ids=[0, 1, 2]),
        "dflash": make_dflash_draft(
            target, root / "dflash", block_size=3, layer_ids=(0, 1), mask_token_id=4
        ),
    }


# method -> (models -> its speculative config)
SPECS = {
    "none": lambda m: SpeculativeConfig(),
    "eagle3-chain": lambda m: SpeculativeConfig("eagle3", str(m["eagle3"]), num_steps=3),
    "eagle3-tree": lambda m: SpeculativeConfig(
        "eagle3", str(m["eagle3"]), num_steps=3, topk=2, num_draft_tokens=5
    ),
    "mtp": lambda m: SpeculativeConfig("mtp", num_steps=2),
    # the drafts' q zero outside the map (speculative/hot_vocab.py)
    "mtp-token-map": lambda m: SpeculativeConfig("mtp", num_steps=2, token_map=str(m["token_map"])),
    "ngram": lambda m: SpeculativeConfig("ngram", num_steps=3, ngram_min=1),
    "draft": lambda m: SpeculativeConfig("draft", str(m["draft"]), num_steps=3),
    "dflash": lambda m: SpeculativeConfig("dflash", str(m["dflash"]), num_steps=2),
    "dflash-token-map": lambda m: SpeculativeConfig(
        "dflash", str(m["dflash"]), num_steps=2, token_map=str(m["token_map"])
    ),
    # adaptive speculation, forced through 0 .. 3 drafts step after step (speculative/adaptive.py)
    "eagle3-adaptive": lambda m: SpeculativeConfig(
        "eagle3", str(m["eagle3"]), num_steps=3, adaptive=True
    ),
}
