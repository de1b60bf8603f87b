"""``outpace bench multi``: tensor and data parallelism measured on the GPUs of one machine, in one run
(issue 20). Three parts, each its own rows in ``OUT/multi_gpu.json``, a plot and a short table last:

- ``correctness``: TP = world greedy tokens of the zoo targets (those whose family shards) and of a random
  8B-shaped checkpoint against TP = 1's, fp32 (equal, token for token) and bf16 (the match rate; bf16
  sums in another order can flip a near tie); every zoo drafter at TP = world, fp32, against plain
  decoding at TP = world (lossless: equal).
- ``tp_speed``: random bf16 targets of the Llama-3.1-8B and -70B shapes, plain decode tokens/s at batch 1,
  8, 32 (context 512; bench/gpu.py ``time_decode``) against the floor of the GPUs: each GPU's weight and
  KV bytes over the copy bandwidth measured in this run, plus the all-reduces of one step measured alone
  (two per layer of [batch, hidden] bf16, in one captured graph: bench/rank_group.py). EAGLE3: on the zoo
  widened into the 8B shape (real acceptance, bench/widen.py) against plain decoding of the same target,
  steady tokens/s (bench/e2e.py); on the 70B shape under ORACLE acceptance (assumed, labelled as such):
  the captured step costs with 0..k drafts that adaptive speculation profiles at start-up, and the best
  k's tokens per second for an assumed per-position acceptance (bench/hybrid_shape.py's model), with a
  random EAGLE3 draft of SpecForge's layout (bench/random_checkpoint.py).
- ``dp``: the widened 8B target served, 64 concurrent streams (and 256, where one replica saturates): one
  replica against two behind one server, one per GPU (``outpace serve --data-parallel-size 2``;
  bench/dp_serve.py); ``dp_eagle3``: the same with speculation on (the widened EAGLE3 draft, as the server
  runs it by default: adaptive, up to 5 drafts a step; chains of ``eagle3_steps`` where ``eagle3_adaptive`` is
  off), where a step's cost grows with its rows (each verifies 1 + k tokens), so that one replica's batch of
  64 costs more than either replica's batch of 32 in plain decoding.
- ``item1`` (issue 46 item 1): the collectives inside the captured iteration: the ``graphs_shape`` target
  (8B) at TP = 1 and TP = world, batch 1, 8, 32, each engine step's replays of the captured decode steps by
  bucket over bench/gpu.py ``time_decode``'s timed steps (engine/cuda_graphs.py ``CapturedCall.replays``):
  one replay of the batch's bucket per step, no step run eagerly; at TP = world torch.profiler over a few
  decode steps says which call launched each NCCL kernel (a graph launch or not); per-rank memory sizing
  of the same engines (KV blocks from memory, engine/memory.py): each rank's weight bytes, KV blocks, memory
  plan and device memory free after start-up (bench/rank_group.py ``engine_facts``); and hybrid targets
  at TP = world as ``correctness`` checks the others: the zoo's Qwen3.5 (``tinyqwen35``) and a random
  checkpoint of a Qwen3-Next layer slice at its real widths (``hybrid_random``, with its MTP layer), fp32
  equal to TP = 1, the bf16 match rate, and their drafters (EAGLE3, MTP) lossless at TP = world in fp32.
- ``qwen3next80b`` (issue 46 item 3): Qwen3-Next-80B-A3B whole (48 layers, bench/family_shapes.py
  QWEN3_NEXT_80B) in bf16 at TP = world with random weights built on each GPU, rank by rank
  (``load_format="dummy"``: as a checkpoint it is about 160 GB, more than the device machine's disk
  holds): plain decode tokens/s at batch 1, 8, 32 against the floor of the bytes each GPU reads (bench/
  families.py ``step_budget`` of rank 0's shard: the distinct experts the batch chose, its KV rows and
  recurrent state) over the copy bandwidth, plus the all-reduces of one step measured alone; and with its
  MTP layer (random: it accepts nothing) under ORACLE acceptance, as the 70B shape's EAGLE3.
- ``ep`` (issue 46 item 2): expert parallelism, layer slices of DeepSeek-V3 and Step-3.5-Flash (``ep_models``,
  bench/family_shapes.py) at EP = TP = world (vLLM's ``--enable-expert-parallel``: attention heads split
  over the ranks, the routed experts placed whole, layers/moe.py) with random weights built on each GPU, as
  ``qwen3next80b``: plain decode at batch 1, 8, 32 against the floor of the bytes each GPU reads (its share
  of the distinct experts the batch chose: bench/families.py ``StepBudget.expert_ranks``) plus the
  collectives of one step measured alone (per layer the attention's all-reduce and the MoE's, which is
  the experts' dispatch and combine: layers/moe.py says why an all-reduce), and the model's MTP layer (one
  MoE MTP layer, ``with_mtp``; random: it accepts nothing) under ORACLE acceptance.
- ``step35flash`` (issue 46 item 3): Step-3.5-Flash whole (45 layers, bench/family_shapes.py STEP3P5_FLASH) in
  block FP8, the ``quantization_config`` stepfun-ai/Step-3.5-Flash-FP8 and DeepSeek-V3 publish (bench/
  families.py ``QUANTIZATION_CONFIGS["fp8"]``: e4m3, 128 x 128 blocks), about 200 GB, at EP = TP = world with
  random weights built on each GPU (``load_format="dummy"``: every projection fp8 with its block scales, the
  routed experts as fp8 stacks as that checkpoint stores them; the router, embedding, head, norms, the
  per-head attention gates and the MTP layer's eh_proj and head stay high precision: layers/quant/loading.py
  ``quantize_dummy_modules``), as ``ep`` runs its slices: the collectives of one step alone, plain decode at
  batch 1, 8, 32 against the floor of the bytes each GPU reads (``step_budget`` counts the fp8 weights and
  their scales as stored), and its MTP layer under ORACLE acceptance. Each engine row says what was built
  quantized (``quantized_layout``). A world whose ranks' parts would cut an FP8 block (the shared expert's
  1280 rows are 5 blocks at 2 ranks, 2.5 at 4) is refused before anything runs (``fp8_split_refused``).
``--parts single`` (one GPU): the figures the multi-GPU ones compare with: tp_speed at TP = 1 (a shape
that does not fit one GPU is listed as such) and one replica's throughput.

The ranks are spawned once and build every engine in turn (bench/rank_group.py); each row is written as
it is measured, and an item that no longer fits the time limit is listed under ``not_run``. A run into an
OUT that holds an earlier run's multi_gpu.json continues it: the items that finished there without an error
are kept with their rows and not run again, so a bench longer than one command's limit (the device's ten
minutes) is the same command repeated.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch

from outpace import SamplingParams
from outpace.bench.families import QUANTIZATION_CONFIGS
from outpace.bench.family_shapes import (
    QWEN3_NEXT_80B,
    STEP3P5_FLASH,
    family_shapes,
    slice_layers,
    with_mtp,
)
from outpace.bench.gpu import (
    LLAMA_8B,
    ZOO_DRAFTERS,
    copy_bandwidth,
    engine_8b,
    time_decode,
    weight_bytes_read,
)
from outpace.bench.multi_gpu_report import DP_PARTS
from outpace.bench.oracle import ORACLE_LABEL
from outpace.bench.rank_group import engine_facts, release_memory
from outpace.bench.widen import LLAMA_8B as WIDE_8B
from outpace.bench.widen import Shape, widen_checkpoint, widen_draft
from outpace.config import SpeculativeConfig
from outpace.speculative.metrics import SpecMetrics
from outpace.zoo import zoo_dir

# Llama-3.1-70B's config.json: hidden 8192, 80 layers, 64 query and 8 key/value heads of 128, intermediate
# 28672; vocabulary, RoPE (theta 500000, llama3 scaling) and norms as the 8B's.
LLAMA_70B = {
    **LLAMA_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}
RANK_PARTS = (
    "correctness",
    "tp_speed",
    "item1",
    "qwen3next80b",
    "ep",
    "step35flash",
)  # run on the rank group
PARTS = (*RANK_PARTS, *DP_PARTS)
TIMED = (
    "tp_speed",
    *DP_PARTS,
    "qwen3next80b",
    "ep",
    "step35flash",
)  # the parts whose rows are timings (forget_timings)
# the sections of item1 measured on the machine's GPUs (forget_timings), as opposed to its correctness rows
ITEM1_MACHINE_ROWS = ("graphs", "nccl", "memory")
SEED_NAME = "qwen3-next-80b"
SEED_WEIGHTS = (
    "random bf16 weights built on each GPU, each rank its own shard (load_format='dummy'); as a checkpoint "
    "the model is about 160 GB, more than the device machine's 128 GiB disk holds"
)

EP_SHAPES = ("deepseek-v3-slice", "step-3.5-flash-slice")  # bench/family_shapes.py names
STEP_NAME = "step-3.5-flash-fp8"
STEP_WEIGHTS = (
    "random block-FP8 weights built on each GPU, each rank its own shard (load_format='dummy'); as a "
    "checkpoint the model is about 200 GB (stepfun-ai/Step-3.5-Flash-FP8), more than the device machine's "
    "disk holds beside its other files"
)


def step35flash_fp8() -> dict:
    """``step35flash``'s model: Step-3.5-Flash whole with the block-FP8 quantization_config."""
    return {**STEP3P5_FLASH, "quantization_config": QUANTIZATION_CONFIGS["fp8"]}


def fp8_split_refused(config: dict, world: int) -> str | None:
    """Why ``config``'s block-FP8 projections cannot be split over ``world`` tensor-parallel ranks, or None.
    At EP = TP = world (models/step3p5.py, layers/decoder.py) each attention type's query heads (q rows, o
    columns) and kv heads (k, v rows; replicated when fewer than the ranks), the shared expert's and the
    dense MLP's intermediate rows (gate, up rows, down columns) are split, the routed experts placed whole:
    each rank's part of every split width must be whole blocks in both directions of ``weight_block_size``
    (a rank would otherwise need a scale its neighbour holds: layers/quant/linear.py ``scale_shard``)."""
    block = config["quantization_config"]["weight_block_size"]
    head_dim = config["head_dim"]
    sliding = config.get("attention_other_setting") or {}
    widths = {
        "num_attention_heads x head_dim": config["num_attention_heads"] * head_dim,
        "attention_other_setting.num_attention_heads x head_dim": sliding.get(
            "num_attention_heads", config["num_attention_heads"]
        )
        * head_dim,
        "share_expert_dim": config["share_expert_dim"],
        "intermediate_size": config["intermediate_size"],
    }
    for name, kv in (
        ("num_attention_groups", config["num_attention_groups"]),
        (
            "attention_other_setting.num_attention_groups",
            sliding.get("num_attention_groups", config["num_attention_groups"]),
        ),
    ):
        if kv >= world:
            widths[f"{name} x head_dim"] = kv * head_dim
    cut = [
        f"{name} {width} / {world} ranks = {width / world:g}"
        for name, width in widths.items()
        if width % world or any((width // world) % b for b in block)
    ]
    if not cut:
        return None
    return (
        f"step35flash at EP = TP = {world}: each rank's part of {'; '.join(cut)} is not whole "
        f"{block[0]} x {block[1]} FP8 blocks, so a rank would need a block scale another holds (the "
        "shared expert's 1280 rows split into whole blocks over 2 ranks, 5 each, not over 4 or 8): run "
        "it on 2 GPUs, or leave the part out"
    )


def ep_slices() -> dict[str, dict]:
    """``ep``'s shapes: their configs by name (bench/family_shapes.py)."""
    shapes = family_shapes()
    return {name: shapes[name].config for name in EP_SHAPES}


@dataclass(frozen=True)
class Case:
    """Correctness: ``model`` at TP = world against ``reference`` (default: the same model) at TP = 1."""

    name: str
    model: str
    reference: str | None = None
    dtypes: tuple[str, ...] = ("float32", "bfloat16")


@dataclass(frozen=True)
class Plan:
    """What the run measures; the defaults are the GPU run's, tests pass tiny shapes."""

    device: str = "cuda"
    world: int = 2
    shapes: dict = field(
        default_factory=lambda: {"8b": LLAMA_8B, "70b": LLAMA_70B}
    )  # tp_speed targets
    random_shape: str = "8b"  # the random checkpoint of correctness
    widen_to: Shape | None = WIDE_8B  # the zoo widened for EAGLE3 and DP (None: the zoo itself)
    widened_shape: str = "8b"  # the shapes entry the widened zoo stands for
    zoo_targets: tuple[str, ...] = ("tinypy", "tinyds", "tinygemma")  # those present
    drafters: tuple[str, ...] = tuple(ZOO_DRAFTERS)  # bench/gpu.py's zoo drafters, on tinypy
    # the family targets' own drafts (those present): (target, method, zoo draft or None, num_steps)
    family_drafters: tuple[tuple[str, str, str | None, int], ...] = (
        ("tinyds", "mtp", None, 2),
        ("tinyds", "eagle3", "tinyds-eagle3", 4),
        ("tinygemma", "eagle3", "tinygemma-eagle3", 4),
    )
    cases: tuple[Case, ...] = ()  # extra correctness cases
    prompts: int = 8  # correctness: prompts, tokens each
    tokens: int = 32
    batches: tuple[int, ...] = (1, 8, 32)
    context: int = 512
    decode_steps: int = 16
    speed_tokens: int = 64  # EAGLE3 rows: tokens per request
    batch1_prompts: int = 3  # EAGLE3 rows at batch 1: prompts one after another
    eagle3_steps: int = 5  # adaptive, up to this many drafts (as bench e2e)
    eagle3_adaptive: bool = True  # False: chains of eagle3_steps every step (no timing)
    oracle_steps: int = 4
    dp_streams: int = 64
    dp_requests: int = 512  # 8 per stream, one after another (bench/dp_serve.py)
    dp_engine_process: bool = True  # a third server: one replica with --engine-process
    dp_max_tokens: int = 128
    dp_kv_blocks: int = 4096  # per replica: holds every stream of both levels
    dp_saturated_streams: int | None = 256  # a second level, where one replica's batch saturates it
    dp_client_processes: int = 4  # the load's client processes (server/bench.py run_load)
    # item1 (issue 46 item 1)
    graphs_shape: str = "8b"  # the shapes entry whose captured steps and memory plan are checked
    graph_steps: int = 16  # decode steps whose graph replays are counted, per batch
    # decode steps profiled for the launches of NCCL kernels (on GPUs, TP = world, the middle batch)
    profile_steps: int = 4
    hybrid_zoo_targets: tuple[str, ...] = ("tinyqwen35",)  # those present
    # (target, method, zoo draft or None, num_steps), as family_drafters
    hybrid_family_drafters: tuple[tuple[str, str, str | None, int], ...] = (
        ("tinyqwen35", "eagle3", "tinyqwen35-eagle3", 4),
        ("tinyqwen35", "mtp", None, 2),
    )
    # a random checkpoint of Qwen3-Next's first 4 layers (3 DeltaNet + 1 gated attention, each with its 512
    # experts) and its MTP layer, at the real widths (~9 GB in bf16); its MTP drafts with hybrid_mtp_steps
    hybrid_random: dict = field(default_factory=lambda: with_mtp(slice_layers(QWEN3_NEXT_80B, 4)))
    # the dtypes in which the hybrid targets are compared with TP = 1
    hybrid_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    hybrid_mtp_steps: int = 2
    # qwen3next80b (issue 46 item 3): the model whole; an engine's build, capture and rows take about this
    seed_model: dict = field(default_factory=lambda: QWEN3_NEXT_80B)
    seed_item_s: float = 120.0
    # ep (issue 46 item 2): the shapes by name; an engine's build, capture and rows take about ep_item_s
    ep_models: dict = field(default_factory=ep_slices)
    ep_item_s: float = 75.0
    # step35flash (issue 46 item 3): the model whole in block FP8; an engine's build (about 100 GB of random
    # fp8 per GPU at EP = 2), its 45 layers' graphs captured and its rows take about step35flash_item_s (the
    # plain item took 52 to 61 s on two H200s, gpu_2026-11-29e and 2026-11-30f, the MTP one 65)
    step35flash_model: dict = field(default_factory=step35flash_fp8)
    step35flash_item_s: float = 120.0
    # qwen3next80b, ep, step35flash on GPUs: rank 0's kernels of one decode step at these batches, in the order
    # they ran (bench/profile.py ``decode_step_timeline``), each to OUT/timeline_<shape>@<batch>.txt
    timeline_batches: tuple[int, ...] = (1,)
    # qwen3next80b, ep, step35flash: their MTP items under ORACLE acceptance (bench multi --no-oracle: off)
    seed_oracle: bool = True
    time_limit_s: float = 540.0  # the whole run; items that no longer fit are skipped
    dp_reserve_s: float = 260.0  # per data-parallel part

    def item_seconds(self, shape: dict) -> float:
        """A rough budget for one engine of ``shape`` (build, capture, rows), to skip what cannot finish."""
        return 20.0 + 0.4 * shape["num_hidden_layers"] if self.device.startswith("cuda") else 1.0


class Clock:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# ---- helpers --------------------------------------------------------------------------------------------
def zoo_prompts(count: int) -> list[str]:
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    return [prompts[i % len(prompts)] for i in range(count)]


def prompts_for(model: str, count: int, vocab: int) -> list:
    """The zoo's held-out text for a model with a tokenizer, else fixed token ids (bench/decode.py's)."""
    if (Path(model) / "tokenizer.json").is_file():
        return zoo_prompts(count)
    return [[(13 * i + 7 * j) % vocab for j in range(32)] for i in range(count)]


def compare(reference: list[list[int]], outs) -> dict:
    """Greedy tokens against a reference: equal, the match rate position by position (bench/e2e.py), the
    first (prompt, position) that differs."""
    from outpace.bench.e2e import _match

    tokens = [o.token_ids for o in outs]
    first = next(
        (
            [i, j]
            for i, (r, t) in enumerate(zip(reference, tokens))
            for j in range(max(len(r), len(t)))
            if j >= min(len(r), len(t)) or r[j] != t[j]
        ),
        None,
    )
    return {
        "equal": tokens == reference,
        "match_rate": _match(outs, reference),
        "first_mismatch": first,
    }


def tau(outs) -> float | None:
    spec = SpecMetrics.total(o.spec_metrics for o in outs)
    return spec.acceptance_length if spec.num_verifies else None


def kv_bytes_per_token(llm) -> int:
    """KV bytes one token takes on this rank (its shard of the heads), over every layer."""
    return sum(
        t[0, 0].numel() * t.element_size() for pair in llm.engine.runner.kv_caches for t in pair
    )


def fits_one_device(shape: dict, device: str, tp: int) -> tuple[bool, str]:
    """Whether a bf16 model of ``shape`` fits ``tp`` devices (weights within 90% of each one's memory)."""
    if not device.startswith("cuda"):
        return True, ""
    from outpace.model_config import ModelConfig
    from outpace.models.loader import build_model

    params = sum(
        p.numel()
        for p in build_model(ModelConfig.from_dict(shape), torch.bfloat16, "meta").parameters()
    )
    memory = torch.cuda.get_device_properties(0).total_memory
    need = 2 * params / tp
    return need < 0.9 * memory, (
        f"{2 * params / 1e9:.0f} GB of bf16 weights, {need / 2**30:.1f} GiB per GPU at "
        f"TP = {tp}, one GPU holds {memory / 2**30:.0f} GiB"
    )


def zoo_draft(spec: SpeculativeConfig) -> SpeculativeConfig:
    """``spec`` with its draft (a zoo checkpoint named by its folder) in this checkout's zoo."""
    return (
        dataclasses.replace(spec, draft=str(zoo_dir() / Path(spec.draft).name))
        if spec.draft
        else spec
    )


def family_drafts(
    family_drafters: tuple[tuple[str, str, str | None, int], ...],
) -> list[tuple[str, str, str, SpeculativeConfig]]:
    """Plan.family_drafters' entries whose target and draft the zoo holds, as (target name, target
    directory, method, config)."""
    zoo = zoo_dir()
    return [
        (
            target,
            str(zoo / target),
            method,
            zoo_draft(SpeculativeConfig(method, draft, num_steps=steps)),
        )
        for target, method, draft, steps in family_drafters
        if (zoo / target).is_dir() and (draft is None or (zoo / draft).is_dir())
    ]


def widened_zoo(plan: Plan, workdir: Path) -> tuple[str, str]:
    """(target, EAGLE3 draft): the zoo widened into ``plan.widen_to`` (written once), or the zoo itself."""
    zoo = zoo_dir()
    if plan.widen_to is None:
        return str(zoo / "tinypy"), str(zoo / "tinypy-eagle3")
    target, draft = workdir / "tinypy", workdir / "tinypy-eagle3"
    if not (target / "config.json").is_file():
        widen_checkpoint(zoo / "tinypy", target, plan.widen_to, torch.bfloat16)
    if not (draft / "config.json").is_file():
        hidden = Shape.of(json.loads((zoo / "tinypy" / "config.json").read_text())).hidden
        widen_draft(
            zoo / "tinypy-eagle3", draft, plan.widen_to, torch.bfloat16, target_hidden=hidden
        )
    return str(target), str(draft)


# ---- rank 0 ---------------------------------------------------------------------------------------------
class Run:
    """Rank 0's side of the run: the parts, rows recorded and saved as they come."""

    def __init__(
        self, group, plan: Plan, result: dict, path: Path, workdir: Path, clock: Clock
    ) -> None:
        self.group, self.plan, self.result, self.path = group, plan, result, path
        self.workdir, self.clock = workdir, clock
        self.widening: threading.Thread | None = None
        self.widening_error: str | None = None
        self.current_item: str | None = None  # the item whose rows are being measured

    def widen_in_background(self) -> None:
        """Write the widened zoo (CPU work) while the GPUs run correctness; ``tp_speed`` waits for it before
        timing anything, so it takes no host time from a timed step."""

        def widen() -> None:
            try:
                widened_zoo(self.plan, self.workdir)
            except (
                Exception
            ) as e:  # recorded; the EAGLE3 item tries again and reports its own failure
                self.widening_error = f"{type(e).__name__}: {e}"

        self.widening = threading.Thread(target=widen, name="widen-zoo", daemon=True)
        self.widening.start()

    def save(self) -> None:
        """Written whole or not at all (the parent may stop this rank at any moment)."""
        part = self.path.with_suffix(".json.part")
        part.write_text(json.dumps(self.result, indent=1) + "\n")
        part.replace(self.path)

    def item(self, name: str, seconds: float, fn) -> None:
        """Run one item (an engine and its rows) if ``seconds`` are left and an earlier run into this OUT did
        not finish it; its error is recorded, the run goes on."""
        if name in self.result["done"]:
            return
        self._drop_rows_of(name)  # a retried item's partial rows from the run that failed it
        if self.clock.left() < seconds:
            self.result["not_run"].append(
                f"{name}: {self.clock.left():.0f} s left of the time limit, ~{seconds:.0f} s needed"
            )
        elif not self.group.healthy:
            self.result["not_run"].append(
                f"{name}: the rank group was given up after an earlier failure"
            )
        else:
            t0, self.current_item = time.monotonic(), name
            try:
                fn()
            except Exception as e:  # one broken item must not cost the others' figures
                self.result["errors"][name] = f"{type(e).__name__}: {e}"
                print(f"bench multi: {name} failed:\n{traceback.format_exc()}")
            else:
                self.result["done"].append(name)
            release_memory()
            self.result["seconds"][name] = round(time.monotonic() - t0, 1)
            self.group.settled()
        self.save()

    def add(self, rows: list, row: dict) -> None:
        """Append a measured row, tagged with the item that measured it, and save."""
        rows.append({**row, "item": self.current_item})
        self.save()

    def _drop_rows_of(self, name: str) -> None:
        def drop(section: dict) -> None:  # (``ep`` holds a section per shape)
            for rows in section.values():
                if isinstance(rows, list):
                    rows[:] = [r for r in rows if r.get("item") != name]
                elif isinstance(rows, dict):
                    drop(rows)

        for part in RANK_PARTS:
            drop(self.result.get(part, {}))

    def engine(self, model: str, tp: int, **engine):
        return self.group.llm(model, device=self.plan.device, tensor_parallel_size=tp, **engine)

    def generate(
        self,
        model: str,
        prompts: list,
        dtype: str,
        tp: int,
        spec: SpeculativeConfig | None = None,
        logprobs: int | None = None,
    ):
        params = SamplingParams(
            temperature=0.0, max_tokens=self.plan.tokens, ignore_eos=True, logprobs=logprobs
        )
        spec = spec or SpeculativeConfig()
        with self.engine(
            model, tp, dtype=dtype, max_num_seqs=len(prompts), speculative=spec
        ) as llm:
            return llm.generate(prompts, params)

    # ---- correctness ------------------------------------------------------------------------------------
    def correctness(self) -> None:
        plan, world = self.plan, self.group.world
        section = self.result.setdefault(
            "correctness", {"tokens": plan.tokens, "tp": world, "tp_equality": [], "lossless": []}
        )
        zoo = zoo_dir()
        cases = [
            Case(name, str(zoo / name))
            for name in plan.zoo_targets
            if (zoo / name / "config.json").is_file()
        ]
        shape = plan.shapes[plan.random_shape]
        random_dir = self.workdir / f"random-{plan.random_shape}"
        if self._random_written("correctness", random_dir, shape):
            cases.append(Case(f"random-{plan.random_shape}", str(random_dir)))
        cost = {f"random-{plan.random_shape}": plan.item_seconds(shape)}
        plain = self._tp_equality("correctness", section, [*cases, *plan.cases], cost)
        drafts = [
            ("tinypy", str(zoo / "tinypy"), name, zoo_draft(ZOO_DRAFTERS[name]))
            for name in plan.drafters
        ]
        self._lossless(
            "correctness", section, drafts + family_drafts(plan.family_drafters), plain, {}
        )

    def _random_written(self, part: str, out: Path, config: dict) -> bool:
        """Write the random checkpoint of ``config`` into ``out`` (an item of ``part``; again on a fresh
        machine); whether it is there."""
        writing = f"{part}: write the random checkpoint" + (
            "" if part == "correctness" else f" {out.name}"
        )
        if not (out / "config.json").is_file() and writing in self.result["done"]:
            self.result["done"].remove(writing)  # continued on a fresh machine: written again
        self.item(
            writing, 10 + config["num_hidden_layers"], lambda: self._random_checkpoint(out, config)
        )
        return (out / "config.json").is_file()

    def _tp_equality(
        self, part: str, section: dict, cases: list[Case], cost: dict[str, float]
    ) -> dict[str, list]:
        """TP = world greedy tokens of each case against TP = 1's (items of ``part``; ``cost``: seconds per
        engine by case name, 15 by default); returns the TP = world fp32 tokens by case (the drafters'
        reference), and sets the section's fp32 verdict."""
        plan, world = self.plan, self.group.world
        plain: dict[str, list] = {}
        for case in cases:
            vocab = json.loads((Path(case.model) / "config.json").read_text())["vocab_size"]
            prompts = prompts_for(case.model, plan.prompts, vocab)
            for dtype in case.dtypes:

                def row(case=case, dtype=dtype, prompts=prompts) -> None:
                    reference = [
                        o.token_ids
                        for o in self.generate(case.reference or case.model, prompts, dtype, 1)
                    ]
                    outs = self.generate(case.model, prompts, dtype, world)
                    if dtype == "float32" and case.reference is None:
                        plain[case.name] = [o.token_ids for o in outs]
                    against = (
                        "TP = 1"
                        if case.reference is None
                        else f"TP = 1 of {Path(case.reference).name}"
                    )
                    self.add(
                        section["tp_equality"],
                        {
                            "model": case.name,
                            "dtype": dtype,
                            "tp": world,
                            "reference": against,
                            **compare(reference, outs),
                        },
                    )

                self.item(f"{part}: {case.name} {dtype}", 2 * cost.get(case.name, 15.0), row)
        rows = section["tp_equality"]
        section["all_tp_equal_fp32"] = (
            all(r["equal"] for r in rows if r["dtype"] == "float32") if rows else None
        )
        return plain

    def _lossless(
        self,
        part: str,
        section: dict,
        drafts: list[tuple[str, str, str, SpeculativeConfig]],
        plain: dict[str, list],
        cost: dict[str, float],
    ) -> None:
        """Each (target name, target directory, drafter name, its config) at TP = world in fp32 against plain
        decoding at TP = world (``plain``: tokens by target name, measured here when missing); items of
        ``part``, ``cost`` seconds per engine by target name (15 by default); sets the section's verdict."""
        plan, world = self.plan, self.group.world
        for target, model, name, spec in drafts:

            def lossless(target=target, model=model, name=name, spec=spec) -> None:
                vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
                prompts = prompts_for(model, plan.prompts, vocab)
                if target not in plain:
                    plain[target] = [
                        o.token_ids for o in self.generate(model, prompts, "float32", world)
                    ]
                outs = self.generate(model, prompts, "float32", world, spec)
                row = compare(plain[target], outs)
                if row["first_mismatch"]:
                    prompt, position = row["first_mismatch"]
                    row["plain_top2_gap"] = self._top2_gap(model, prompts[prompt], position)
                self.add(
                    section["lossless"],
                    {
                        "drafter": name,
                        "target": target,
                        "dtype": "float32",
                        "tp": world,
                        "tau": tau(outs),
                        **row,
                    },
                )

            self.item(f"{part}: {target} {name} lossless", cost.get(target, 15.0), lossless)
        section["all_lossless_fp32"] = (
            all(r["equal"] for r in section["lossless"]) if section["lossless"] else None
        )

    def _top2_gap(self, model: str, prompt, position: int) -> float | None:
        """How near a tie plain decoding (TP = world, fp32) is at ``position`` of ``prompt``'s output: its two
        most likely tokens' log-probability gap there (run alone, so a batch's sums may differ from the
        compared run's by rounding). A gap at rounding size says the drafter's tokens differ where the
        verify forward's sums (another batch shape) flip a tie, not where speculation changed the output."""
        (out,) = self.generate(model, [prompt], "float32", self.group.world, logprobs=2)
        if out.logprobs is None or position >= len(out.logprobs):
            return None
        top = sorted(
            (x.logprob for x in out.logprobs[position].values() if x.rank <= 2), reverse=True
        )
        return top[0] - top[1] if len(top) == 2 else None

    def _random_checkpoint(self, out: Path, shape: dict) -> None:
        from outpace.bench.random_checkpoint import random_target

        random_target(out, shape, device=self.plan.device)

    # ---- tensor-parallel speed ----------------------------------------------------------------------------
    def tp_speed(self) -> None:
        plan, world = self.plan, self.group.world
        self.result.setdefault(
            "tp_speed",
            {"context": plan.context, "decode": [], "all_reduce": [], "eagle3": [], "oracle": []},
        )
        if self.widening is not None:
            self.widening.join()
            if self.widening_error:
                self.result["errors"]["widening the zoo"] = self.widening_error
        sizes = sorted({1, world})
        for name, shape in plan.shapes.items():
            if world > 1:
                self.item(
                    f"tp_speed: all-reduces {name}",
                    10.0,
                    lambda name=name, shape=shape: self._all_reduces(name, shape),
                )
            for tp in sizes:
                fits, why = fits_one_device(shape, plan.device, tp)
                if not fits:
                    self.result["not_run"].append(
                        f"tp_speed: {name} at TP = {tp} does not fit: {why}"
                    )
                    continue
                self.item(
                    f"tp_speed: {name} plain TP = {tp}",
                    plan.item_seconds(shape),
                    lambda name=name, shape=shape, tp=tp: self._decode(name, shape, tp),
                )
        self.item(
            "tp_speed: EAGLE3 on the widened zoo",
            3 * plan.item_seconds(plan.shapes[plan.widened_shape]),
            self._eagle3_widened,
        )
        for name, shape in plan.shapes.items():
            if name == plan.widened_shape or not fits_one_device(shape, plan.device, world)[0]:
                continue
            self.item(
                f"tp_speed: EAGLE3 oracle {name} TP = {world}",
                1.5 * plan.item_seconds(shape),
                lambda name=name, shape=shape: self._eagle3_oracle(name, shape),
            )

    def _all_reduces(self, name: str, shape: dict, rows: list | None = None) -> None:
        """The all-reduces of one decode step (two per layer of [batch, hidden] bf16: the mixer's and the
        MLP's partial sums) measured alone, per batch, into ``rows`` (tp_speed's by default)."""
        from outpace.bench.rank_group import time_all_reduces

        count = 2 * shape["num_hidden_layers"]
        for batch in self.plan.batches:
            timed = self.group.run(
                time_all_reduces, count, batch, shape["hidden_size"], self.plan.device
            )
            self.add(
                self.result["tp_speed"]["all_reduce"] if rows is None else rows,
                {
                    "shape": name,
                    "batch": batch,
                    "all_reduces": count,
                    "hidden": shape["hidden_size"],
                    "dtype": "bfloat16",
                    **timed,
                },
            )

    def _random_engine(
        self, workdir: Path, shape: dict, tp: int, spec: SpeculativeConfig | None, **engine
    ) -> tuple[str, dict]:
        """bench/gpu.py ``engine_8b`` for ``shape`` at TP = ``tp`` on the plan's device, with KV blocks for the
        plan's largest batch at its context; ``engine``: EngineConfig fields on top."""
        plan = self.plan
        return engine_8b(
            workdir,
            spec,
            plan.context,
            max(plan.batches),
            config=shape,
            device=plan.device,
            tensor_parallel_size=tp,
            **engine,
        )

    def _decode(self, name: str, shape: dict, tp: int) -> None:
        plan = self.plan
        bandwidth = self.result["copy_bandwidth_bytes_per_s"]
        reduces = {
            r["batch"]: r["seconds"]
            for r in self.result["tp_speed"]["all_reduce"]
            if r["shape"] == name
        }
        model, kwargs = self._random_engine(self.workdir / name, shape, tp, None)
        with self.group.llm(model, **kwargs) as llm:
            weights, kv = weight_bytes_read(llm.engine.model), kv_bytes_per_token(llm)
            for batch in plan.batches:
                row = time_decode(llm, batch, plan.context, plan.decode_steps)
                read_s = (weights + batch * plan.context * kv) / bandwidth
                reduce_s = reduces.get(batch, float("nan")) if tp > 1 else 0.0
                floor = batch / (read_s + reduce_s)
                row.update(
                    shape=name,
                    tp=tp,
                    weight_bytes_per_gpu=weights,
                    kv_bytes_per_token_per_gpu=kv,
                    read_seconds=read_s,
                    all_reduce_seconds=reduce_s,
                    floor_tokens_per_s=floor,
                    fraction_of_floor=row["tokens_per_s"] / floor,
                )
                self.add(self.result["tp_speed"]["decode"], row)

    def _eagle3_widened(self) -> None:
        """Plain decoding and EAGLE3 (adaptive, as bench e2e runs it; ``eagle3_adaptive`` False: fixed chains) on the
        widened zoo at TP = world (one GPU: TP = 1), steady tokens/s over the held-out prompts; an adaptive EAGLE3
        engine's step costs give oracle rows too."""
        from outpace.bench.e2e import _run

        plan, tp = self.plan, self.group.world
        target, draft = widened_zoo(plan, self.workdir)
        prompts = zoo_prompts(max(plan.batches))
        counts = {b: plan.batch1_prompts if b == 1 else b for b in plan.batches}
        greedy = SamplingParams(temperature=0.0, max_tokens=plan.speed_tokens, ignore_eos=True)
        methods = {
            "none": SpeculativeConfig(),
            "eagle3": SpeculativeConfig(
                "eagle3", draft, num_steps=plan.eagle3_steps, adaptive=plan.eagle3_adaptive
            ),
        }
        plain_tokens, rows = {}, self.result["tp_speed"]["eagle3"]
        label = f"{plan.widened_shape} (widened zoo)" if plan.widen_to else "zoo"
        engine = dict(
            dtype="bfloat16",
            max_num_seqs=max(plan.batches),
            num_kv_blocks=max(plan.batches) * (plan.context // 16 + 16) + 64,
        )
        for method, spec in methods.items():
            with self.engine(target, tp, speculative=spec, **engine) as llm:
                for batch in plan.batches:
                    _run(
                        llm, prompts, batch, greedy.replace(max_tokens=4), counts[batch]
                    )  # warm-up: prefill shapes
                    _run(llm, prompts, batch, greedy, batch)  # and this batch's steps
                    outs, seconds, steady = _run(llm, prompts, batch, greedy, counts[batch])
                    row = {
                        "shape": label,
                        "tp": tp,
                        "method": method,
                        "batch": batch,
                        "steady_tokens_per_s": steady,
                        "tokens_per_s": sum(len(o.token_ids) for o in outs) / seconds,
                        "tau": tau(outs),
                    }
                    if method == "none":
                        plain_tokens[batch] = [o.token_ids for o in outs]
                    else:
                        row["match_plain_greedy"] = compare(plain_tokens[batch], outs)["match_rate"]
                        base = next(
                            r
                            for r in rows
                            if r["method"] == "none" and r["batch"] == batch and r["tp"] == tp
                        )
                        row["speedup"] = steady / base["steady_tokens_per_s"]
                    self.add(rows, row)
                if method == "eagle3" and plan.eagle3_adaptive:
                    self._oracle_rows(llm, label, tp)
        if not plan.eagle3_adaptive:  # the oracle rows read adaptive speculation's step costs
            adaptive = dataclasses.replace(methods["eagle3"], adaptive=True)
            with self.engine(target, tp, speculative=adaptive, **engine) as llm:
                self._oracle_rows(llm, label, tp)

    def _eagle3_oracle(self, name: str, shape: dict) -> None:
        from outpace.bench.random_checkpoint import random_eagle3_draft

        plan, tp = self.plan, self.group.world
        draft = random_eagle3_draft(self.workdir / f"{name}-eagle3", shape, device=plan.device)
        spec = SpeculativeConfig("eagle3", str(draft), num_steps=plan.oracle_steps, adaptive=True)
        model, kwargs = self._random_engine(self.workdir / name, shape, tp, spec)
        with self.group.llm(model, **kwargs) as llm:
            self._oracle_rows(llm, name, tp)

    def _oracle_rows(
        self, llm, name: str, tp: int, rows: list | None = None, method: str = "eagle3"
    ) -> None:
        """Per batch: the captured step's cost with 0..k drafts (adaptive speculation's start-up profile on a
        GPU; on the CPU, measured by running steps), the oracle speed-ups they give and the tokens/s of the
        best k at each assumed acceptance (batch x expected tokens / its step), into ``rows`` (tp_speed's
        by default)."""
        from outpace.bench.oracle import captured_step_costs, oracle_rows

        for batch in self.plan.batches:
            costs = captured_step_costs(llm, batch, self.plan.context)
            for row in oracle_rows(costs, batch):
                self.add(
                    self.result["tp_speed"]["oracle"] if rows is None else rows,
                    {
                        "shape": name,
                        "tp": tp,
                        "batch": batch,
                        "method": method,
                        **row,
                        "step_ms": {k: 1e3 * c for k, c in sorted(costs.items())},
                        "label": ORACLE_LABEL,
                    },
                )

    # ---- issue 46 item 1 ----------------------------------------------------------------------------------
    def item1(self) -> None:
        """The module docstring's ``item1``: captured collectives and memory sizing, then the hybrids."""
        plan, world = self.plan, self.group.world
        section = self.result.setdefault(
            "item1",
            {
                "tp": world,
                "tokens": plan.tokens,
                "graphs": [],
                "nccl": [],
                "memory": [],
                "tp_equality": [],
                "lossless": [],
            },
        )
        shape = plan.shapes[plan.graphs_shape]
        for tp in sorted({1, world}):
            self.item(
                f"item1: graphs and memory {plan.graphs_shape} TP = {tp}",
                plan.item_seconds(shape),
                lambda tp=tp: self._graphs_and_memory(plan.graphs_shape, shape, tp, section),
            )
        zoo = zoo_dir()
        cases = [
            Case(name, str(zoo / name), dtypes=plan.hybrid_dtypes)
            for name in plan.hybrid_zoo_targets
            if (zoo / name / "config.json").is_file()
        ]
        random_dir = self.workdir / "random-qwen3-next"
        drafts = family_drafts(plan.hybrid_family_drafters)
        cost = {random_dir.name: plan.item_seconds(plan.hybrid_random)}
        if self._random_written("item1", random_dir, plan.hybrid_random):
            cases.append(Case(random_dir.name, str(random_dir), dtypes=plan.hybrid_dtypes))
            mtp = SpeculativeConfig("mtp", num_steps=plan.hybrid_mtp_steps)
            drafts.append((random_dir.name, str(random_dir), "mtp", mtp))
        plain = self._tp_equality("item1", section, cases, cost)
        self._lossless("item1", section, drafts, plain, cost)

    def _graphs_and_memory(self, name: str, shape: dict, tp: int, section: dict) -> None:
        """The random ``shape`` at TP = ``tp``, its KV pool sized from memory and its decode step captured for
        ``plan.batches``: every rank's start-up figures, then per batch the graph replays of each timed
        decode step; at TP > 1 on a GPU, which calls launched the NCCL kernels of a few decode steps."""
        plan = self.plan
        model, kwargs = self._random_engine(
            self.workdir / name,
            shape,
            tp,
            None,
            num_kv_blocks=None,  # sized from each rank's memory (engine/memory.py)
            cuda_graph_sizes=plan.batches,
            # (the CPU sizes from its RAM only when given a share of it)
            **({} if plan.device.startswith("cuda") else {"cpu_memory_utilization": 0.1}),
        )
        with self.group.llm(model, cpu_graphs=True, **kwargs) as llm:
            ranks = [engine_facts(llm.engine)]
            if tp > 1:
                ranks += self.group.follower_facts()
            self.add(section["memory"], {"shape": name, "tp": tp, "ranks": ranks})
            for batch in plan.batches:
                row = decode_replays(llm, batch, plan.context, plan.graph_steps)
                self.add(section["graphs"], {"shape": name, "tp": tp, **row})
            if tp > 1 and plan.device.startswith("cuda"):
                batch = plan.batches[len(plan.batches) // 2]
                row = nccl_launches(llm, batch, plan.context, plan.profile_steps)
                self.add(section["nccl"], {"shape": name, "tp": tp, **row})

    # ---- issue 46 item 3 ----------------------------------------------------------------------------------
    def qwen3next80b(self) -> None:
        """The module docstring's ``qwen3next80b``."""
        plan, world = self.plan, self.group.world
        config = plan.seed_model
        section = self.result.setdefault(
            "qwen3next80b",
            self._seed_section(
                f"Qwen/Qwen3-Next-80B-A3B-Instruct's config.json (bench/family_shapes.py), "
                f"{config['num_hidden_layers']} layers",
                SEED_WEIGHTS,
            ),
        )
        self._seed_items(
            "qwen3next80b", f"TP = {world}", SEED_NAME, config, section, plan.seed_item_s
        )

    def step35flash(self) -> None:
        """The module docstring's ``step35flash``: the collectives, plain decode and MTP at EP = TP = world."""
        plan, world = self.plan, self.group.world
        config = plan.step35flash_model
        block = config["quantization_config"]["weight_block_size"]
        section = self.result.setdefault(
            "step35flash",
            self._seed_section(
                f"stepfun-ai/Step-3.5-Flash's config.json (bench/family_shapes.py STEP3P5_FLASH), "
                f"{config['num_hidden_layers']} layers, with stepfun-ai/Step-3.5-Flash-FP8's block-FP8 "
                f"quantization_config ({block[0]} x {block[1]} blocks)",
                STEP_WEIGHTS,
                ep=world,
            ),
        )
        self._seed_items(
            "step35flash", f"EP = TP = {world}", STEP_NAME, config, section,
            plan.step35flash_item_s, expert_parallel_size=world,
        )  # fmt: skip

    # ---- issue 46 item 2 ----------------------------------------------------------------------------------
    def ep(self) -> None:
        """The module docstring's ``ep``: each shape's collectives, plain decode and MTP at EP = TP = world."""
        plan, world = self.plan, self.group.world
        part = self.result.setdefault("ep", {"ep": world, "tp": world, "shapes": {}})
        for name, config in plan.ep_models.items():
            section = part["shapes"].setdefault(
                name,
                self._seed_section(
                    f"{name} (bench/family_shapes.py), {config['num_hidden_layers']} layers",
                    SEED_WEIGHTS.split(";")[0],
                    ep=world,
                ),
            )
            self._seed_items(
                f"ep: {name}", f"EP = {world}", name, config, section, plan.ep_item_s,
                expert_parallel_size=world,
            )  # fmt: skip

    def _seed_section(self, model: str, weights: str, **parallel) -> dict:
        """The rows of a model measured by ``_seed_items``."""
        return {
            "model": model,
            "weights": weights,
            "tp": self.group.world,
            **parallel,
            "context": self.plan.context,
            "all_reduce": [],
            "engines": [],
            "decode": [],
            "oracle": [],
        }

    def _seed_items(
        self, label: str, parallel: str, name: str, config: dict, section: dict, seconds: float,
        **engine,
    ) -> None:  # fmt: skip
        """``label``'s items for the model of ``config`` on the world's ranks (``engine``: EngineConfig fields
        on top): the all-reduces of one step alone, plain decode, its MTP layer under ORACLE acceptance
        (``seed_oracle``)."""
        if self.group.world > 1:
            self.item(
                f"{label}: all-reduces",
                10.0,
                lambda: self._all_reduces(name, config, section["all_reduce"]),
            )
        self.item(
            f"{label}: plain {parallel}",
            seconds,
            lambda: self._seed_decode(name, config, section, **engine),
        )
        if self.plan.seed_oracle:
            self.item(
                f"{label}: MTP ORACLE {parallel}",
                seconds,
                lambda: self._seed_mtp(name, with_mtp(config), section, **engine),
            )

    def _seed_engine(
        self, name: str, config: dict, spec: SpeculativeConfig, section: dict, what: str, **engine
    ):
        """The model of ``config`` at TP = world with random weights built on each GPU (``engine``: EngineConfig
        fields on top); its build seconds and every rank's start-up figures recorded as ``what``."""
        plan, world = self.plan, self.group.world
        model, kwargs = self._random_engine(
            self.workdir / f"{name}-{what}",
            config,
            world,
            spec,
            max_num_batched_tokens=2048,  # (bench/families.py's prefill chunks for the MoE shapes)
            cuda_graph_sizes=plan.batches,
            **engine,
        )
        t0 = time.monotonic()
        llm = self.group.llm(model, **kwargs)
        try:
            ranks = [engine_facts(llm.engine)] + (self.group.follower_facts() if world > 1 else [])
            self.add(
                section["engines"],
                {
                    "engine": what,
                    "build_s": time.monotonic() - t0,
                    "ranks": ranks,
                    "quantized": quantized_layout(llm.engine.model),
                },
            )
        except BaseException:
            llm.close()
            raise
        return llm

    def _seed_decode(self, name: str, config: dict, section: dict, **engine) -> None:
        """Plain decode at each batch against the floor of the bytes each GPU reads (bench/families.py
        ``step_budget`` of rank 0's shard, ``step_bytes``) over the copy bandwidth, plus the all-reduces."""
        from outpace.bench.families import distinct_experts, step_budget, step_bytes

        plan, world = self.plan, self.group.world
        bandwidth = self.result["copy_bandwidth_bytes_per_s"]
        reduces = {r["batch"]: r["seconds"] for r in section["all_reduce"]}
        with self._seed_engine(
            name, config, SpeculativeConfig(), section, "plain", **engine
        ) as llm:
            budget = step_budget(llm, config)
            for batch in plan.batches:
                row = time_decode(llm, batch, plan.context, plan.decode_steps)
                floor_bytes = step_bytes(budget, batch, plan.context)
                read_s = floor_bytes / bandwidth
                reduce_s = reduces.get(batch, float("nan")) if world > 1 else 0.0
                floor = batch / (read_s + reduce_s)
                row.update(
                    shape=name,
                    tp=world,
                    ep=budget.expert_ranks,
                    floor_bytes_per_gpu=floor_bytes,
                    expected_distinct_experts=distinct_experts(
                        budget.num_experts, budget.top_k, batch
                    ),
                    read_seconds=read_s,
                    all_reduce_seconds=reduce_s,
                    floor_tokens_per_s=floor,
                    fraction_of_floor=row["tokens_per_s"] / floor,
                )
                self.add(section["decode"], row)
            if plan.device.startswith("cuda"):
                for batch in plan.timeline_batches:
                    self._timeline(llm, name, batch, section)

    def _timeline(self, llm, name: str, batch: int, section: dict) -> None:
        """Rank 0's kernels of one decode step of ``llm`` at ``batch`` into OUT/timeline_<name>@<batch>.txt,
        their count and span into the section's ``timelines``."""
        from outpace.bench.profile import decode_step_timeline

        lines = [name, *decode_step_timeline(llm, batch, self.plan.context)]
        path = self.path.parent / f"timeline_{name}@{batch}.txt"
        path.write_text("\n".join(lines) + "\n")
        kernels, span = len(lines) - 3, float(lines[-1].split()[1])
        self.add(
            section.setdefault("timelines", []),
            {"batch": batch, "kernels": kernels, "span_us": span, "file": path.name},
        )

    def _seed_mtp(self, name: str, config: dict, section: dict, **engine) -> None:
        """Its MTP layer drafting up to ``oracle_steps`` tokens under ORACLE acceptance (random weights
        accept nothing): the captured step's cost with 0..k drafts, per batch."""
        spec = SpeculativeConfig("mtp", num_steps=self.plan.oracle_steps, adaptive=True)
        with self._seed_engine(name, config, spec, section, "mtp", **engine) as llm:
            self._oracle_rows(llm, name, self.group.world, section["oracle"], "mtp")


def quantized_layout(model) -> dict:
    """What rank 0's model holds quantized: its quantized projections and expert stacks, their bytes as stored
    against every parameter's and buffer's (layers/quant/loading.py ``quantized_bytes``), and the names of
    the projections left in high precision (``nn.Linear`` modules, by their last name)."""
    from torch import nn

    from outpace.layers.quant.experts import QuantizedStackedWeight
    from outpace.layers.quant.linear import QuantizedLinear
    from outpace.layers.quant.loading import quantized_bytes

    quantized, total = quantized_bytes(model)
    modules = list(model.modules())
    return {
        "projections": sum(isinstance(m, QuantizedLinear) for m in modules),
        "expert_stacks": sum(isinstance(m, QuantizedStackedWeight) for m in modules),
        "quantized_bytes": quantized,
        "total_bytes": total,
        "high_precision_linears": sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, m in model.named_modules()
                if isinstance(m, nn.Linear)
            }
        ),
    }


def decode_replays(llm, batch: int, context: int, steps: int) -> dict:
    """bench/gpu.py ``time_decode`` at ``batch`` with each engine step's replays of the captured decode
    steps counted by bucket (engine/cuda_graphs.py ``CapturedCall.replays``). Over its ``steps`` timed
    steps (its last engine steps), each should replay the batch's bucket once. With run-ahead a step
    launches the next step's graph; in steady state that is one replay per step all the same."""
    from outpace.engine.cuda_graphs import bucket_for

    engine = llm.engine
    graphs = engine.runner.decode_step.graphs

    def replays() -> Counter:
        by_bucket = Counter()
        for key, graph in graphs.items():
            by_bucket[key.bucket] += graph.replays
        return by_bucket

    per_step: list[Counter] = []
    step = engine.step

    def counted():
        before = replays()
        out = step()
        per_step.append(replays() - before)
        return out

    engine.step = counted  # (this engine's steps only, for this call)
    try:
        row = time_decode(llm, batch, context, steps)
    finally:
        del engine.step
    timed, bucket = per_step[-steps:], bucket_for(engine.runner.graph_buckets, batch)
    total = sum(timed, Counter())
    return {
        "batch": batch,
        "bucket": bucket,
        "graphs_captured": len(graphs),
        "decode_steps": steps,
        "replays_by_bucket": {str(b): n for b, n in sorted(total.items())},
        # each step launches one decode step (its own, or with run-ahead the next one): those not replayed
        # from a graph ran eagerly
        "eager_steps": max(0, steps - sum(total.values())),
        "one_replay_per_step": all(c == Counter({bucket: 1}) for c in timed),
        "step_ms": row["step_ms"],
        "tokens_per_s": row["tokens_per_s"],
    }


def nccl_launches(llm, batch: int, context: int, steps: int) -> dict:
    """torch.profiler (CPU and CUDA) over ``steps`` decode steps of bench/gpu.py ``time_decode`` at ``batch``
    (after its prefill and warm-up steps): the NCCL kernels that ran by the host call that launched each
    (``kernels_by_launch``). NCCL kernels launched by a graph launch ran inside a captured step."""
    from torch.profiler import ProfilerActivity, profile

    engine = llm.engine
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    decode_only = 0
    step = engine.step

    def profiled():
        nonlocal decode_only
        scheduler = engine.scheduler
        if not scheduler.waiting and all(r.num_output_tokens > 0 for r in scheduler.running):
            decode_only += 1
            if decode_only == 4:  # the first timed step, after time_decode's three warm-up steps
                prof.start()
        return step()

    engine.step = profiled  # (this engine's steps only, for this call)
    try:
        time_decode(llm, batch, context, steps)
        torch.cuda.synchronize()
    finally:
        del engine.step
        if decode_only >= 4:
            prof.stop()
    return {"batch": batch, "profiled_steps": steps, **kernels_by_launch(prof.events(), "nccl")}


def kernels_by_launch(events, name_part: str) -> dict:
    """The GPU kernels among profiler ``events`` (torch.profiler FunctionEvents) whose name holds
    ``name_part`` (case-insensitive), counted by the host runtime call that launched each (the one with the
    kernel's correlation id: a graph launch, another launch, or not in the trace), and the verdict: None
    when no such kernel could be matched to its launch, else whether every matched one came from a graph
    launch."""
    cuda = torch.autograd.DeviceType.CUDA
    launch_of = {
        e.id: e.name
        for e in events
        if e.device_type != cuda and e.name.startswith(("cuda", "cu")) and "Launch" in e.name
    }
    kernels = [e for e in events if e.device_type == cuda and name_part in e.name.lower()]
    by_launch = Counter(launch_of.get(e.id, "not in the trace") for e in kernels)
    matched = {name: n for name, n in by_launch.items() if name != "not in the trace"}
    return {
        "kernels": name_part,
        "count": len(kernels),
        "by_launch": dict(by_launch),
        "graph_launches": sum("GraphLaunch" in name for name in launch_of.values()),
        "outside_graphs": sum(n for name, n in matched.items() if "GraphLaunch" not in name),
        "all_in_graphs": all("GraphLaunch" in name for name in matched) if matched else None,
    }


def _rank0_main(
    group, plan: Plan, parts: list[str], path: str, workdir: str, seconds: float
) -> None:
    """Rank 0 of the group (bench/rank_group.py): the parts that run on the ranks."""
    path, workdir = Path(path), Path(workdir)
    result = json.loads(path.read_text())
    run = Run(group, plan, result, path, workdir, Clock(seconds))
    on_gpu = plan.device.startswith("cuda")
    if on_gpu:
        name = torch.cuda.get_device_name()
        if result.get("device") not in (plan.device, name):  # continuing another machine's run
            forget_timings(result, f"measured on {result['device']}, this run is on {name}")
        result["device"] = name
    if (
        "copy_bandwidth_bytes_per_s" not in result
    ):  # a continued run keeps the figure its floors were built on
        result["copy_bandwidth_bytes_per_s"] = copy_bandwidth() if on_gpu else cpu_copy_bandwidth()
    run.save()
    if "tp_speed" in parts:
        run.widen_in_background()
    for part in parts:
        getattr(run, part)()
        run.save()


def cpu_copy_bandwidth(num_bytes: int = 64 << 20, repeats: int = 5) -> float:
    """Bytes/s (read plus written) of a CPU tensor copy, median: the CPU stand-in for bench/gpu.py's."""
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * num_bytes / sorted(times)[repeats // 2]


# ---- the run --------------------------------------------------------------------------------------------
def forget_timings(result: dict, why: str) -> None:
    """Drop the timed sections of a continued run (``TIMED``, item1's graph, NCCL and memory rows, the copy
    bandwidth) and their items: they were measured on another kind of GPU, and one result mixes no
    machines. Correctness rows are kept."""
    dropped = [k for k in (*TIMED, "copy_bandwidth_bytes_per_s") if result.pop(k, None) is not None]
    if "item1" in result:
        for rows in ITEM1_MACHINE_ROWS:
            if result["item1"].pop(rows, None):
                dropped.append(f"item1 {rows}")
            result["item1"][rows] = []
    machine_items = (*TIMED, "item1: graphs")
    result["done"] = [d for d in result["done"] if not d.startswith(machine_items)]
    result["seconds"] = {k: v for k, v in result["seconds"].items() if k in result["done"]}
    result.setdefault("earlier_run", {})["timings_dropped"] = f"{', '.join(dropped)}: {why}"


def continued(earlier: dict, fresh: dict) -> dict:
    """The result a run starts from when ``out_dir`` holds an earlier run's: its measured sections, the copy
    bandwidth their floors used and the items it finished (``done``, with their seconds) are kept; its
    errors and not-run items are retried, and recorded under ``earlier_run``."""
    result = {
        **fresh,
        "earlier_run": {k: earlier[k] for k in ("parts", "errors", "not_run") if k in earlier},
    }
    result["parts"] = sorted(
        set(earlier.get("parts", [])) | set(fresh["parts"]), key=list(PARTS).index
    )
    result.update(
        {k: earlier[k] for k in (*PARTS, "device", "copy_bandwidth_bytes_per_s") if k in earlier}
    )
    result["done"] = list(earlier.get("done", []))
    result["seconds"] = {k: v for k, v in earlier.get("seconds", {}).items() if k in result["done"]}
    return result


def run_multi_gpu_bench(
    out_dir: Path,
    parts: str = ",".join(PARTS),
    plan: Plan | None = None,
    workdir: Path = Path(".multi_gpu_models"),
) -> dict:
    """Run the parts (comma-separated of ``PARTS``, or ``single``); results in ``out_dir``: multi_gpu.json
    (multi_gpu_single.json for ``single``), a plot beside it; a table printed last."""
    from outpace.bench.dp_serve import dp_throughput
    from outpace.bench.multi_gpu_report import plot_multi_gpu, print_multi_gpu, targets
    from outpace.bench.rank_group import BenchGroup, run_in_group

    plan = plan or Plan()
    single = parts == "single"
    names = (
        ["tp_speed", *DP_PARTS] if single else [p.strip() for p in parts.split(",") if p.strip()]
    )
    unknown = [p for p in names if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown part(s) {unknown}: choose from {', '.join(PARTS)} or 'single'")
    refused = "step35flash" in names and fp8_split_refused(plan.step35flash_model, plan.world)
    if refused:
        raise ValueError(refused)
    if single:
        plan = dataclasses.replace(plan, world=1)
    elif plan.device == "cuda" and torch.cuda.device_count() < plan.world:
        raise ValueError(
            f"--gpus {plan.world}: this machine has {torch.cuda.device_count()} GPU(s)"
        )
    clock = Clock(plan.time_limit_s)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ("multi_gpu_single.json" if single else "multi_gpu.json")
    result = {
        "parts": names,
        "world": plan.world,
        "device": plan.device,
        "torch": torch.__version__,
        "plan": {k: v for k, v in dataclasses.asdict(plan).items() if k != "cases"},
        "errors": {},
        "not_run": [],
        "seconds": {},
        "done": [],
    }
    if path.is_file():
        result = continued(json.loads(path.read_text()), result)
    path.write_text(json.dumps(result, indent=1) + "\n")
    on_ranks = [p for p in names if p in RANK_PARTS]
    pending_dp = [p for p in names if p in DP_PARTS and p not in result["done"]]
    if on_ranks:
        seconds = clock.left() - plan.dp_reserve_s * len(pending_dp)
        if plan.world > 1:
            clean = run_in_group(
                plan.world,
                plan.device,
                workdir,
                _rank0_main,
                (plan, on_ranks, str(path), str(workdir), seconds - 20),
                seconds,
            )
            result = json.loads(path.read_text())
            if not clean:
                result["errors"]["ranks"] = (
                    "a rank did not exit cleanly (stopped by the run; see the log)"
                )
        else:
            _rank0_main(
                BenchGroup(1, plan.device, None, None),
                plan,
                on_ranks,
                str(path),
                str(workdir),
                seconds,
            )
            result = json.loads(path.read_text())
    for part in pending_dp:
        try:
            target, draft = widened_zoo(plan, workdir)
            drafter = (
                ("--method", "none")
                if DP_PARTS[part] == "none"
                else (
                    "--method",
                    DP_PARTS[part],
                    "--draft",
                    draft,
                    # adaptive: the server's default, up to 5 drafts a step as each batch size pays
                    *(() if plan.eagle3_adaptive else ("--num-steps", str(plan.eagle3_steps))),
                )
            )
            result[part] = dp_throughput(plan, target, drafter, replicas=1 if single else 2)
            result["done"].append(part)
        except Exception as e:
            result["errors"][part] = f"{type(e).__name__}: {e}"
            print(f"bench multi: {part} failed:\n{traceback.format_exc()}")
        path.write_text(json.dumps(result, indent=1) + "\n")
    result["targets"] = targets(result)
    path.write_text(json.dumps(result, indent=1) + "\n")
    try:
        plot_multi_gpu(result, path.with_suffix(".png"))
    except Exception as e:  # (matplotlib missing) the figures are in the JSON and the table
        print(f"bench multi: no plot: {type(e).__name__}: {e}")
    print_multi_gpu(result)
    return result
