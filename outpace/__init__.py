"""outpace: an LLM inference engine built around lossless speculative decoding."""

import importlib
from typing import TYPE_CHECKING

from outpace.threads import prefer_passive_wait

prefer_passive_wait()  # before torch loads (outpace/threads.py)

__all__ = ["LLM", "EngineConfig", "ModelConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

# The public names load on first use (PEP 562), so that importing a light module of the package
# (outpace.config, outpace.zoo, the command line's parser: `outpace --help`) does not import torch.
_MODULE_OF = {
    "LLM": "outpace.engine.llm",
    "EngineConfig": "outpace.config",
    "ModelConfig": "outpace.model_config",
    "RequestOutput": "outpace.request",
    "SamplingParams": "outpace.sampling_params",
}


def __getattr__(name: str):
    if name in _MODULE_OF:
        return getattr(importlib.import_module(_MODULE_OF[name]), name)
    raise AttributeError(f"module 'outpace' has no attribute {name!r}")


if TYPE_CHECKING:
    from outpace.config import EngineConfig
    from outpace.engine.llm import LLM
    from outpace.model_config import ModelConfig
    from outpace.request import RequestOutput
    from outpace.sampling_params import SamplingParams
