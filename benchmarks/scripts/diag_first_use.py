"""What a request pays on first use on the GPU (issue 15 diagnosis): Triton compilations and garbage
collections, timed, and the engine steps they fall in.

``python3 benchmarks/scripts/diag_first_use.py readme``: the README's main command in this process (EAGLE3 on the
zoo), then the same generation again; ``python3 benchmarks/scripts/diag_first_use.py e2e``: bench e2e's first
rows (the zoo target generates and is dropped, then plain decoding on the zoo widened to 8B, its warm-up
rounds and its timed batch-1 greedy run), with every step over 30 ms listed with what happened in it;
``python3 benchmarks/scripts/diag_first_use.py family FAMILY METHOD [--widened]``: a bench e2e row of one drafter
on a family's zoo target (bench/e2e.py ``FAMILIES``, ``drafters``), at batch 1, its warm-ups and timed runs as
bench e2e runs them (every prompt's prefill greedy, then per temperature one prompt to the end and the timed
prompts), on the zoo model itself (the same kernels as the widened one, in seconds) or ``--widened``.
gpu_2026-12-01g call 5: DeepSeek's MTP row lost seconds in its timed closed batch at temperature 0.8 only, about
0.4 s a prompt, where the warm-up had run one prompt at 0.8."""

import gc
import json
import sys
import time
from pathlib import Path

import torch
import triton.runtime.jit as triton_jit

events: list[tuple[float, str, float]] = []  # (end time, what, seconds)


# kernel name -> the specialisations compiled so far
variants: dict[str, list[dict[str, object]]] = {}


def _new_in(self, constexprs: dict, attrs: dict) -> str:
    """What sets this compile of the kernel apart: the arguments whose constexpr value or specialisation
    (Triton's attributes: divisibility by 16, ...) differ from the closest variant compiled before."""
    spec = {self.arg_names[k[0]]: v for k, v in constexprs.items()}
    spec |= {self.arg_names[k[0]]: str(v) for k, v in attrs.items()}
    before = variants.setdefault(self.fn.__name__, [])
    before.append(spec)
    if len(before) == 1:
        return "first"
    keys = lambda old: {a for a in spec.keys() | old.keys() if spec.get(a) != old.get(a)}  # noqa: E731
    closest = min(before[:-1], key=lambda old: len(keys(old)))
    return "; ".join(f"{a}: {closest.get(a)} -> {spec.get(a)}" for a in sorted(keys(closest)))


def _hook_compiles() -> None:
    real = triton_jit.JITFunction._do_compile

    def timed(self, key, signature, device, constexprs, options, attrs, *rest):
        t = time.perf_counter()
        out = real(self, key, signature, device, constexprs, options, attrs, *rest)
        what = f"compile {self.fn.__name__} [{_new_in(self, constexprs, attrs)}]"
        events.append((time.perf_counter(), what, time.perf_counter() - t))
        return out

    triton_jit.JITFunction._do_compile = timed
    started = [0.0]

    def on_gc(phase, info):
        if phase == "start":
            started[0] = time.perf_counter()
        elif time.perf_counter() - started[0] > 1e-3:
            events.append(
                (
                    time.perf_counter(),
                    f"gc gen {info['generation']}",
                    time.perf_counter() - started[0],
                )
            )

    gc.callbacks.append(on_gc)


def _summary(since: float, label: str) -> None:
    mine = [e for e in events if e[0] >= since]
    print(
        f"{label}: {len(mine)} events, {sum(e[2] for e in mine):.2f} s: "
        + ", ".join(f"{w} {1e3 * s:.0f} ms" for _, w, s in mine[:40])
    )


def readme() -> None:
    from outpace.cli import main

    for run in (1, 2):
        t = time.perf_counter()
        main(["generate", "--prompt", "def fibonacci(n):"])
        _summary(t, f"README command, run {run} in this process ({time.perf_counter() - t:.1f} s)")


def e2e() -> None:
    from outpace import LLM, SamplingParams
    from outpace.bench.e2e import _run
    from outpace.bench.widen import LLAMA_8B, widen_zoo

    w = Path(".e2e_models")
    if not (w / "tinypy" / "config.json").is_file():
        widen_zoo("zoo", w, LLAMA_8B, dtype=torch.bfloat16)
    prompts = json.loads(Path("zoo/eval_prompts.json").read_text())["prompts"]
    greedy = SamplingParams(temperature=0.0, max_tokens=128, ignore_eos=True)
    t = time.perf_counter()
    zoo = LLM("zoo/tinypy", device="cuda", dtype="bfloat16", max_num_seqs=32)
    _run(zoo, prompts, 1, greedy, 8)
    del zoo
    _summary(t, "zoo target")
    t = time.perf_counter()
    llm = LLM(
        str(w / "tinypy"), device="cuda", dtype="bfloat16", max_num_seqs=32, num_kv_blocks=1024
    )
    _summary(t, "plain engine start")
    for label, params, count in (
        ("warm-up prefills", greedy.replace(max_tokens=4), 8),
        ("warm-up decode", greedy, 1),
        ("timed", greedy, 8),
    ):
        _phase(llm, prompts, label, params, count)


def _phase(llm, prompts, label: str, params, count: int) -> None:
    """bench e2e's ``_run`` of ``count`` prompts at batch 1, then its events and its steps over 30 ms."""
    from outpace.bench.e2e import _run

    steps, real_step, real_execute = [], llm.engine.step, llm.engine.runner.execute

    def execute(batch, *args, **kwargs):
        chunks = [
            (s.request.num_computed_tokens, s.num_new_tokens) for s in batch if s.num_new_tokens > 1
        ]
        if chunks:  # a prefill's chunks: (rows before it, its tokens)
            events.append((time.perf_counter(), f"prefill {chunks}", 0.0))
        return real_execute(batch, *args, **kwargs)

    def step():
        s = time.perf_counter()
        out = real_step()
        steps.append((s, time.perf_counter()))
        return out

    llm.engine.step, llm.engine.runner.execute = step, execute
    t = time.perf_counter()
    _, seconds, steady = _run(llm, prompts, 1, params, count)
    llm.engine.step, llm.engine.runner.execute = real_step, real_execute
    _summary(t, f"{label}: {seconds:.2f} s, steady {steady:.0f} tokens/s")
    for s, e in steps:
        if e - s > 0.03:
            inside = [f"{w} {1e3 * d:.0f} ms" for end, w, d in events if s <= end <= e]
            print(f"  step of {1e3 * (e - s):.0f} ms: {', '.join(inside) or 'nothing logged'}")


def family(name: str, method: str, widened: bool) -> None:
    from outpace.bench.e2e import (
        FAMILIES,
        TEMPERATURES,
        bench_device,
        drafters,
        row_params,
        target_llm,
        widened_zoo,
    )
    from outpace.zoo import zoo_dir

    fam = FAMILIES[name]
    if widened:
        models = widened_zoo(Path(".e2e_models"), name, False, torch.bfloat16)
    else:
        models = {m: zoo_dir() / m for m in fam.models}
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    t = time.perf_counter()
    spec = drafters(models, name)[method]
    device, dtype = bench_device()  # (float32 on a CPU: a smoke run, no Triton there)
    # (max_num_seqs 1: as bench e2e --batch-sizes 1 builds the row's engine)
    llm = target_llm(models, name, spec, False, device=device, dtype=dtype, max_num_seqs=1)
    _summary(t, f"{name} {method} engine start")
    count, greedy = 8, row_params(0.0, 64)
    _phase(llm, prompts, "warm-up prefills (greedy, 4 tokens)", greedy.replace(max_tokens=4), count)
    for temperature in TEMPERATURES:
        params = row_params(temperature, 64)
        _phase(llm, prompts, f"warm-up decode, temperature {temperature}", params, 1)
        _phase(llm, prompts, f"timed, temperature {temperature}", params, count)


if __name__ == "__main__":
    _hook_compiles()
    if sys.argv[1] == "family":
        family(sys.argv[2], sys.argv[3], "--widened" in sys.argv[4:])
    else:
        {"readme": readme, "e2e": e2e}[sys.argv[1]]()
