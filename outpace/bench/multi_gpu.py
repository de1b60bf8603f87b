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
  quantized (bench/multi_gpu_measures.py ``quantized_layout``). A world whose ranks' parts would cut an FP8
  block (the shared expert's 1280 rows are 5 blocks at 2 ranks, 2.5 at 4) is refused before anything runs
  (bench/multi_gpu_plan.py ``fp8_split_refused``).
``--parts single`` (one GPU): the figures the multi-GPU ones compare with: tp_speed at TP = 1 (a shape
that does not fit one GPU is listed as such) and one replica's throughput.

The ranks are spawned once and build every engine in turn (bench/rank_group.py); each row is written as
it is measured, and an item that no longer fits the time limit is listed under ``not_run``. A run into an
OUT that holds an earlier run's multi_gpu.json continues it: the items that finished there without an error
are kept with their rows and not run again, so a bench longer than one command's limit (the device's ten
minutes) is the same command repeated.

Where the parts live: this file runs them (``RANK_PARTS`` on the ranks, rank 0's bookkeeping ``Run``, the
data-parallel parts) and continues an earlier run; what is measured, on which models: multi_gpu_plan.py
(``Plan``); ``correctness`` and the checks item1 shares: multi_gpu_correctness.py; ``tp_speed`` and the
collectives, random engines and ORACLE rows the other timed parts share: multi_gpu_tp_speed.py; ``item1``:
multi_gpu_item1.py; ``qwen3next80b``, ``ep``, ``step35flash``: multi_gpu_seed.py; the measures taken on an
engine inside a rank: multi_gpu_measures.py; verdicts, plot and table: multi_gpu_report.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
from pathlib import Path

import torch

from outpace import SamplingParams
from outpace.bench.gpu import copy_bandwidth
from outpace.bench.multi_gpu_correctness import correctness
from outpace.bench.multi_gpu_item1 import item1
from outpace.bench.multi_gpu_measures import cpu_copy_bandwidth
from outpace.bench.multi_gpu_plan import Clock, Plan, fp8_split_refused, widened_zoo
from outpace.bench.multi_gpu_report import DP_PARTS
from outpace.bench.multi_gpu_seed import ep, qwen3next80b, step35flash
from outpace.bench.multi_gpu_tp_speed import tp_speed
from outpace.bench.rank_group import release_memory
from outpace.config import SpeculativeConfig

# the parts run on the rank group: part -> the function that runs it on rank 0's Run
RANK_PARTS = {
    "correctness": correctness,
    "tp_speed": tp_speed,
    "item1": item1,
    "qwen3next80b": qwen3next80b,
    "ep": ep,
    "step35flash": step35flash,
}
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


# ---- rank 0 ---------------------------------------------------------------------------------------------
class Run:
    """Rank 0's side of the run: its items run and their rows recorded and saved as they come (the parts,
    ``RANK_PARTS``, are functions of it)."""

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
        RANK_PARTS[part](run)
        run.save()


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
