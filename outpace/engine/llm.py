"""The offline API: ``LLM(model=PATH).generate(prompts, params)``.

``LLM(PATH, tensor_parallel_size=N)`` shards the model over N ranks (outpace/distributed/): from a plain
process it starts ranks 1 .. N-1 itself (torch.multiprocessing spawn: a script must guard its top
level with ``if __name__ == "__main__":``, as for any spawned process); under ``torchrun
--nproc-per-node N`` the constructor on ranks > 0 serves rank 0 and then exits the process, so the
script's rest runs on rank 0 alone. ``close()`` (or leaving a ``with LLM(...) as llm:`` block) stops
the other ranks; collecting the object does too.
"""
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

    def close(self) -> None:
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

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
