"""The offline API: ``LLM(model=PATH).generate(prompts, params)``."""
from __future__ import annotations

from typing import Sequence

from tqdm.auto import tqdm

from outpace.config import EngineConfig, SamplingParams
from outpace.engine.engine import LLMEngine
from outpace.request import RequestOutput

Prompt = str | Sequence[int]


class LLM:
    def __init__(self, model: str, progress: bool = False, **engine_kwargs) -> None:
        self.engine = LLMEngine(EngineConfig(model=model, **engine_kwargs), progress=progress)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 progress: bool = False) -> list[RequestOutput]:
        """Generate for every prompt (text or token ids); outputs come back in prompt order.

        Every prompt is validated before any is queued, so one bad prompt leaves the engine untouched.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = list(params) if isinstance(params, (list, tuple)) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        requests = [self.engine.new_request(p, sp) for p, sp in zip(prompts, params_list)]
        ids = [self.engine.submit(r) for r in requests]
        results: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc="generating", disable=not progress) as bar:
            while len(results) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        results[out.request_id] = out
                        bar.update(1)
        return [results[i] for i in ids]
