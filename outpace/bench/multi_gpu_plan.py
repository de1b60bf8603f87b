"""``bench multi``'s plan (bench/multi_gpu.py runs it): what the run measures (``Plan``, its correctness
``Case``s, the shapes: Llama-3.1-70B's, the ``ep`` slices, Step-3.5-Flash in block FP8 and which worlds its
FP8 blocks split over), the run's time limit (``Clock``), and the zoo models and prompts it measures
(the zoo widened into a real shape, the family drafters present, the held-out prompts)."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from outpace.bench.families import QUANTIZATION_CONFIGS
from outpace.bench.family_shapes import (
    QWEN3_NEXT_80B,
    STEP3P5_FLASH,
    family_shapes,
    slice_layers,
    with_mtp,
)
from outpace.bench.gpu import LLAMA_8B, ZOO_DRAFTERS
from outpace.bench.widen import LLAMA_8B as WIDE_8B
from outpace.bench.widen import Shape, widen_checkpoint, widen_draft
from outpace.config import SpeculativeConfig
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
EP_SHAPES = ("deepseek-v3-slice", "step-3.5-flash-slice")  # bench/family_shapes.py names


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


# ---- the zoo models and prompts measured -------------------------------------------------------------
def zoo_prompts(count: int) -> list[str]:
    prompts = json.loads((zoo_dir() / "eval_prompts.json").read_text())["prompts"]
    return [prompts[i % len(prompts)] for i in range(count)]


def prompts_for(model: str, count: int, vocab: int) -> list:
    """The zoo's held-out text for a model with a tokenizer, else fixed token ids (bench/decode.py's)."""
    if (Path(model) / "tokenizer.json").is_file():
        return zoo_prompts(count)
    return [[(13 * i + 7 * j) % vocab for j in range(32)] for i in range(count)]


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
