"""The engine's host time per step and row: a tiny random target on the CPU (a one-layer, hidden-32 Llama, or the
tests' tiny Qwen3-Next or Nemotron-H hybrid), where the forward costs little, decoding N greedy requests of 64
tokens (after a 32-token prompt) through ``LLMEngine.step``.

    PYTHONPATH=. python benchmarks/scripts/diag_host_cost.py --rows 256 [--stream] [--profile]
    PYTHONPATH=. python benchmarks/scripts/diag_host_cost.py --model qwen3_next --rows 1 8 --graphs --ops

``--stream``: the engine returns every request's text so far each step (``stream_outputs``, as the server runs
it), which adds the incremental detokenization; ``--profile``: the outpace functions by cumulative time.
``--graphs``: the step as it runs on the GPU: ``capture_graphs`` (on the CPU each "replay" runs the iteration
eagerly), so steps take the bucketed path with padding and, unless ``--no-run-ahead``, the next step launched
ahead (Nemotron-H-8B's state keeps it off on the GPU). Each step's time is split into the target's forward and
logits, the rest of the decode iteration (``DecodeStep.step``: metadata, sampling, verify, state writes; one
graph replay on the GPU) and the host's part outside it (scheduling, launch building, bookkeeping, results),
which on the GPU is idle GPU time unless a step launched ahead covers it; medians over the steps of
``--repeats`` runs. ``--ops``: the torch (aten) ops a step dispatches outside the iteration, by name: on the GPU
each one on a device tensor is a kernel or copy launched eagerly (4-6 us of host time), host-tensor ops aside.
``--device cuda``: the same on the GPU, where a captured step's replay is not split (``--graphs`` is implied:
the engine captures) and the host part holds the wait for the step's tokens, unless a step run ahead covers it.

``--method``: the same through the speculative engine, with a drafter as bench e2e configures it (adaptive, up to
its shapes) on a zoo target (``--model tinyqwen35``: the Qwen3.5 hybrid with its MTP layers and EAGLE3 head;
``tinypy``: also DFlash, the standalone draft, n-gram); ``--draft 0`` forces every step to draft nothing (N: a
chain of N), ``auto`` leaves it to the adaptive chooser. The line ends with the decode steps by kind: drafting,
held (zero drafts, the drafter's forward held back: speculative/proposer.py), no draft (plain decoding's step,
or a zero-draft step that runs the drafter's forward: a flush). ``--temperature``: sampled requests, seeded as
bench e2e seeds them. Compare with plain decoding (``--method none``) on the same target, e.g.

    PYTHONPATH=. python benchmarks/scripts/diag_host_cost.py --model tinyqwen35 --method mtp --draft 0 \
        --rows 1 8 32 --graphs --no-run-ahead --ops

2026-11-27, this container's CPU, 256 rows streamed, two interleaved runs each: 19.8 and 20.0 us with the
detokenizer of 73496ed (two ``tokenizer.decode`` calls a step), 18.0 and 16.2 with ``DecodeStream``.
2026-11-28, same CPU, interleaved runs, ad6e2ac -> cfb8f78 (per-row work hoisted, results by column, fewer
objects per row and step): 256 rows median of 8, 14.8 -> 10.3 us; 1024 rows median of 5, 17.0 -> 10.5 us;
256 rows streamed, three runs each, 16.6-18.2 -> 12.3-13.3 us. About 6.5 us of the 256-row figure is the decode
iteration's tensor work on the CPU (forward, logits, verify), which the host code does not change.
2026-11-30, 3dc71f3 -> 1f5e8ac (run-ahead saves by runs of rows, batch rows written only when changed, host copies
reused, step kinds cached), ``--graphs``, medians of interleaved runs, host us a step (ops outside the iteration):
this CPU, 5 runs (3 for Nemotron-H): Llama 1 row 73 -> 55 (9.2 -> 5.3), 8 rows 106 -> 76 (23.5 -> 5.8); Qwen3-Next
1 row 107 -> 88 (21.0 -> 17.1), 8 rows 184 -> 134 (76.6 -> 17.6); Nemotron-H without run-ahead 1 row 82 -> 61,
8 rows 100 -> 77 (5.9 -> 1.9). The H200 (``--device cuda``, whole step: host and any wait for the GPU), 3 runs:
Llama 283 -> 112 and 198 -> 127; Qwen3-Next 219 -> 204 and 324 -> 224; Nemotron-H 176 -> 143 and 207 -> 181.
2026-11-30, zero-draft steps (issue: every drafter >= plain decoding; bench e2e's Qwen3.5 at batch 32 drafted
nothing in most steps yet ran 5-7% below plain decoding), 7fbd5e7 -> aa833fb, this CPU, ``--model tinyqwen35
--draft 0 --graphs --no-run-ahead`` (a hybrid never runs ahead at batch 32 on the H200), medians of 2 interleaved
runs, host us a step at 1 / 8 / 32 rows: plain 46 / 79 / 207 -> 46 / 80 / 220; MTP 58 / 109 / 302 -> 62 / 111 /
293; EAGLE3 57 / 104 / 310 -> 60 / 109 / 278 (runs of one configuration differ by 30 us at 32 rows). Ops outside
the iteration equal plain decoding's before and after (MTP and EAGLE3 1.5 / 2.0 / 3.9, plain 1.4 / 1.9 / 3.8: a
held step is one graph replay, as plain decoding's). What aa833fb removed: 12-14 Python calls per request and step
beyond plain decoding's (SpecMetrics.record and its budget, HoldRule's bound per request twice, the chooser's
remaining budgets and steps-to-finish per request), now none (tests/speculative/test_zero_draft_host.py counts
them); and probes, which at batch 32 cost 1.5-2.5 zero-draft steps each on the H200 (2.3% of EAGLE3's time at
temperature 0.8 on one in 64 steps), now within 1% of the steps' time. Still above plain decoding here: about 60
us a step at 32 rows outside the iteration, not found in per-function timings (about 40 Python calls a step,
whatever the batch: the chooser, the step timer, the key's hashes), and on the GPU, not measurable here: a held
step's graph (EAGLE3's fc over the aux states, the append) and a flush every window (EAGLE3 13 rows, MTP 12).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root
sys.path.insert(
    1, str(ROOT / "tests")
)  # the tests' tiny hybrid checkpoints (helpers/hybrid_models.py)

from outpace.bench.random_checkpoint import random_target  # noqa: E402
from outpace.config import EngineConfig, SpeculativeConfig  # noqa: E402
from outpace.engine.engine import LLMEngine  # noqa: E402
from outpace.sampling_params import SamplingParams  # noqa: E402
from outpace.speculative.proposer import DraftShape  # noqa: E402
from outpace.zoo import zoo_dir  # noqa: E402

TINY = dict(
    architectures=["LlamaForCausalLM"],
    model_type="llama",
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=512,
    max_position_embeddings=512,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    eos_token_id=0,
)
PROMPT_TOKENS = 32
RANDOM_MODELS = (
    "llama",
    "qwen3_next",
    "nemotron_h",
)  # written at random; the zoo's targets as they are
ZOO_TARGETS = ("tinyqwen35", "tinypy")
# --method -> the drafter as bench e2e configures it (adaptive, up to these shapes); "<target>" stands for the
# zoo target's own draft directory of that method (zoo/<target>-eagle3 ...)
METHODS = {
    "none": lambda target: SpeculativeConfig(),
    "mtp": lambda target: SpeculativeConfig(
        "mtp", num_steps=2 if target == "tinyqwen35" else 3, adaptive=True
    ),
    "eagle3": lambda target: SpeculativeConfig(
        "eagle3", str(zoo_dir() / f"{target}-eagle3"), num_steps=4, adaptive=True
    ),
    "eagle3-tree": lambda target: SpeculativeConfig(
        "eagle3",
        str(zoo_dir() / f"{target}-eagle3"),
        num_steps=4,
        topk=4,
        num_draft_tokens=16,
        adaptive=True,
    ),
    "dflash": lambda target: SpeculativeConfig(
        "dflash", str(zoo_dir() / f"{target}-dflash"), num_steps=7, adaptive=True
    ),
    "draft": lambda target: SpeculativeConfig(
        "draft", str(zoo_dir() / f"{target}-draft"), num_steps=4, adaptive=True
    ),
    "ngram": lambda target: SpeculativeConfig("ngram", num_steps=4, adaptive=True),
}


def write_target(model: str, out_dir: str) -> tuple[str, int]:
    """The target's directory (a random checkpoint of ``model`` written into ``out_dir``, or the zoo's) and its
    vocabulary size."""
    if model in ZOO_TARGETS:
        path = zoo_dir() / model
        return str(path), json.loads((path / "config.json").read_text())["vocab_size"]
    if model == "llama":
        random_target(out_dir, TINY, dtype=torch.float32)
        return out_dir, TINY["vocab_size"]
    from helpers.hybrid_models import HYBRIDS, make_hybrid, save_hybrid

    save_hybrid(make_hybrid(model), Path(out_dir))
    return out_dir, HYBRIDS[model][1]["vocab_size"]


class StepClock:
    """Per engine step: seconds in the target's forward and logits, and in the whole decode iteration
    (``DecodeStep.step``, which holds the forward), by wrapping those methods of the engine's instances."""

    def __init__(self, engine: LLMEngine) -> None:
        self.forward = self.iteration = 0.0
        self.inside = 0  # > 0 while the iteration runs
        model, decode_step = engine.model, engine.runner.decode_step
        model.forward = self._timed(model.forward, "forward")
        model.compute_logits = self._timed(model.compute_logits, "forward")
        decode_step.step = self._timed(decode_step.step, "iteration", inside=True)

    def _timed(self, fn, field: str, inside: bool = False):
        def call(*args, **kwargs):
            self.inside += inside
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - start)
                self.inside -= inside

        return call

    def reset(self) -> tuple[float, float]:
        """(forward, iteration) seconds since the last reset."""
        times = self.forward, self.iteration
        self.forward = self.iteration = 0.0
        return times


class OpCounter(TorchDispatchMode):
    """The aten ops dispatched outside the decode iteration (``clock.inside`` zero), by name."""

    def __init__(self, clock: StepClock) -> None:
        super().__init__()
        self.clock, self.outside, self.total = clock, Counter(), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        if not self.clock.inside:
            self.outside[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def submit(engine: LLMEngine, rows: int, tokens: int, vocab: int, temperature: float = 0.0) -> None:
    """``rows`` requests of ``tokens`` tokens each; sampled ones seeded, as bench e2e runs them."""
    for i in range(rows):
        prompt = [1 + (i + j) % (vocab - 2) for j in range(PROMPT_TOKENS)]
        params = SamplingParams(
            temperature=temperature,
            max_tokens=tokens,
            ignore_eos=True,
            seed=0 if temperature else None,
        )
        engine.submit(engine.new_request(prompt, params, f"r{time.perf_counter()}-{i}"))


def decode_all(
    engine: LLMEngine,
    rows: int,
    tokens: int,
    vocab: int,
    clock: StepClock | None = None,
    temperature: float = 0.0,
) -> list[tuple[float, float, float]]:
    """Submit ``rows`` requests and step until all finish: each decode step's (seconds, forward and logits,
    iteration), the first steps (prefill) left out."""
    submit(engine, rows, tokens, vocab, temperature)
    steps = []
    while engine.has_unfinished_requests:
        if clock is not None:
            clock.reset()
        start = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - start
        steps.append((seconds, *(clock.reset() if clock is not None else (0.0, 0.0))))
    return steps[2:]  # (the prefill, and a step run ahead's first launch)


def build(
    model_dir: str,
    rows: int,
    graphs: bool,
    run_ahead: bool,
    stream: bool,
    device: str = "cpu",
    spec: SpeculativeConfig | None = None,
) -> LLMEngine:
    engine = LLMEngine(
        EngineConfig(
            model=model_dir,
            device=device,
            dtype="float32",
            max_num_seqs=rows,
            num_kv_blocks=rows * 12 + 64,
            max_num_batched_tokens=max(rows * 40, 256),
            run_ahead=run_ahead,
            speculative=spec or SpeculativeConfig(),
        ),
        progress=False,
    )
    engine.stream_outputs = stream
    if graphs and device == "cpu":  # (on CUDA the engine captures them itself)
        engine.capture_graphs()
    return engine


def force_draft_length(engine: LLMEngine, steps: int) -> None:
    """Every step drafts a chain of ``steps`` (0: none) in place of the adaptive chooser's choice."""
    shape = DraftShape(steps)
    if shape not in engine.runner.shapes:
        raise SystemExit(f"--draft {steps}: the drafter's shapes are {engine.runner.shapes}")
    for chooser in engine.choosers.values():
        chooser.choose = lambda bucket, request_ids=(), remaining=None: shape


class StepKinds:
    """How many decode steps of each kind ran: drafting, zero drafts held, zero drafts flushing (or, without
    holding, zero drafts), by wrapping ``DecodeStep.run``."""

    def __init__(self, engine: LLMEngine) -> None:
        self.counts = Counter()
        decode_step = engine.runner.decode_step
        run = decode_step.run

        def counted(key, *args, **kwargs):
            kind = "held" if key.hold else "drafting" if key.shape.num_steps else "no draft"
            self.counts[kind] += 1
            return run(key, *args, **kwargs)

        decode_step.run = counted


def measure(
    engine: LLMEngine, rows: int, vocab: int, repeats: int, temperature: float = 0.0
) -> dict[str, float]:
    """Median us per step: the whole step, the forward and logits, the rest of the iteration, the host."""
    clock = StepClock(engine)
    decode_all(engine, rows, 4, vocab, temperature=temperature)  # warm-up
    steps = [
        s for _ in range(repeats) for s in decode_all(engine, rows, 64, vocab, clock, temperature)
    ]
    median = lambda values: 1e6 * statistics.median(values)  # noqa: E731
    return {
        "step": median([s for s, _, _ in steps]),
        "forward": median([f for _, f, _ in steps]),
        "iteration rest": median([i - f for _, f, i in steps]),
        "host": median([s - i for s, _, i in steps]),
    }


def count_ops(
    engine: LLMEngine, rows: int, vocab: int, temperature: float = 0.0
) -> tuple[Counter, float, int]:
    """The aten ops per decode step outside the iteration, by name (averaged over the steps of one run),
    their total per step, and all ops per step."""
    clock = StepClock(engine)
    submit(engine, rows, 64, vocab, temperature)
    engine.step()
    engine.step()  # (as decode_all: the prefill and the first launch left out)
    steps = 0
    with OpCounter(clock) as counter:
        while engine.has_unfinished_requests:
            engine.step()
            steps += 1
    per_step = Counter({op: n / steps for op, n in counter.outside.items()})
    return per_step, sum(per_step.values()), round(counter.total / steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=RANDOM_MODELS + ZOO_TARGETS, default="llama")
    p.add_argument(
        "--method", choices=tuple(METHODS), default="none", help="the drafter (zoo targets)"
    )
    p.add_argument(
        "--draft",
        default="auto",
        help="auto: the adaptive chooser picks each step's draft length; N: every step drafts N (0: none)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="> 0: seeded, as bench e2e")
    p.add_argument("--rows", type=int, nargs="+", default=[256])
    p.add_argument("--repeats", type=int, default=3, help="runs of 64 tokens per measurement")
    p.add_argument("--graphs", action="store_true", help="capture_graphs: the GPU's path")
    p.add_argument("--no-run-ahead", dest="run_ahead", action="store_false")
    p.add_argument("--stream", action="store_true")
    p.add_argument("--device", default="cpu", help="cuda: the GPU's host time (module docstring)")
    p.add_argument("--ops", action="store_true", help="count the ops outside the iteration")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    if a.method != "none" and a.model not in ZOO_TARGETS:
        p.error(
            f"--method {a.method} drafts for the zoo targets: --model {' or '.join(ZOO_TARGETS)}"
        )
    with tempfile.TemporaryDirectory() as tmp:
        target, vocab = write_target(a.model, tmp)
        spec = METHODS[a.method](a.model)
        for rows in a.rows:
            engine = build(target, rows, a.graphs, a.run_ahead, a.stream, a.device, spec)
            if a.draft != "auto":
                force_draft_length(engine, int(a.draft))
            kinds = StepKinds(engine)
            us = measure(engine, rows, vocab, a.repeats, a.temperature)
            print(
                f"{a.model} {a.method} draft {a.draft} temperature {a.temperature} rows {rows} graphs {a.graphs} "
                f"run-ahead {a.run_ahead} stream {a.stream}: "
                + ", ".join(f"{k} {v:.0f}" for k, v in us.items())
                + f" us a step; {us['step'] / rows:.1f} us per row and step; decode steps "
                + ", ".join(f"{k} {n}" for k, n in sorted(kinds.counts.items()))
            )
            if a.ops:
                ops, outside, total = count_ops(engine, rows, vocab, a.temperature)
                listed = ", ".join(f"{op} {n:.2f}" for op, n in ops.most_common())
                print(
                    f"  ops per step: {total} in all, {outside:.1f} outside the iteration: {listed}"
                )
            if a.profile:
                profile = cProfile.Profile()
                profile.enable()
                decode_all(engine, rows, 64, vocab, temperature=a.temperature)
                profile.disable()
                stats = pstats.Stats(profile)
                stats.sort_stats("cumtime").print_stats("outpace", 40)
                stats.sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
