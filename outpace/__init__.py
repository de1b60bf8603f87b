"""outpace: an LLM inference engine built around lossless speculative decoding."""
from outpace.threads import prefer_passive_wait

prefer_passive_wait()  # before torch loads (outpace/threads.py)

from outpace.config import EngineConfig
from outpace.model_config import ModelConfig
from outpace.sampling_params import SamplingParams
from outpace.engine.llm import LLM
from outpace.request import RequestOutput

__all__ = ["LLM", "EngineConfig", "ModelConfig", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
