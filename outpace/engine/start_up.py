"""Engine start-up, one job a function: the checks of the configuration made before anything loads, the
tokenizer, the target, the KV cache's dtype, the provisional pool, the proposer and its draft shapes, the
draft-shape choosers, the pool's size from memory, the prefix cache and the context limit.

``LLMEngine._build`` (engine/engine.py) calls them in an order that matters: what can be refused cheaply
(the configuration, the tokenizer's files, a damaged draft) is refused before the target loads; the seed is
set before the model is built; the proposer is built over the provisional pool, which is sized from memory
only once the runner holds the models (engine/memory.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

import torch

from outpace.attention.kv_quant import is_fp8, resolve_kv_cache_dtype
from outpace.cache.block_pool import BlockPool
from outpace.cache.kv_scales import load_kv_scales
from outpace.cache.prefix_cache import PrefixCache
from outpace.cache.state_checkpoints import StateCheckpoints
from outpace.config import CPU_KV_BLOCKS, EngineConfig
from outpace.distributed.group import RankGroup
from outpace.distributed.lockstep import DriverChoice
from outpace.engine.cuda_graphs import batch_buckets, largest_decode_batch
from outpace.engine.memory import (
    MemoryPlan,
    SequenceRows,
    agree_across_ranks,
    available_ram,
    drafter_row_bytes,
    plan_kv_pool,
    recurrent_state_bytes,
    refuse_too_many_seqs,
    refuse_too_small,
    resize_kv_pool,
    weights_summary,
)
from outpace.engine.prefill_graphs import key_tokens, prefill_buckets
from outpace.engine.runner import ModelRunner
from outpace.engine.step_key import SamplingMode
from outpace.layers.moe import RoutedExperts, experts_off_the_kernels
from outpace.layers.rotary import POSITIONS_PAST_CONTEXT
from outpace.model_config import ModelConfig, eos_token_ids_of
from outpace.models.loader import build_model, load_model
from outpace.registry import proposer_class
from outpace.speculative.adaptive import PROBE_BUDGET, DraftLengthChooser
from outpace.speculative.proposer import DraftShape, Proposer, draft_shapes
from outpace.threads import configure_threads
from outpace.validation import ConfigError, ConfigFields, read_json_object

logger = logging.getLogger("outpace.engine")


# The JSON files transformers' AutoTokenizer reads from a tokenizer directory (config.json is ModelConfig's).
TOKENIZER_JSON_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
    "vocab.json",
)


def report(message: str, progress: bool) -> None:
    """Start-up facts: logged, and printed to stderr when the engine shows progress."""
    logger.info(message)
    if progress:
        print(f"outpace: {message}", file=sys.stderr)


def check_before_loading(config: EngineConfig, model_config: ModelConfig) -> None:
    """Refuse what the configuration alone shows to be wrong, and a damaged draft checkpoint, before the
    target (minutes to load at real size) loads: also a ``max_num_seqs`` whose block-table rows cannot fit
    in memory, and expert parallelism for a model its family builds without routed experts."""
    max_pos = model_config.max_position_embeddings
    spec = config.speculative
    refuse_too_many_seqs(config, SequenceRows(table_blocks(config, max_pos)))
    refuse_expert_parallel_without_experts(config, model_config)
    if spec.enabled and proposer_class(spec.method).takes_draft_checkpoint and not spec.draft:
        raise ConfigError(
            f"SpeculativeConfig.draft={spec.draft!r} is invalid: method {spec.method!r} drafts "
            f"with a draft checkpoint: give its directory"
        )
    if spec.enabled:
        proposer_class(spec.method).check_draft_field(spec)
    if config.max_model_len is not None and config.max_model_len > max_pos:
        raise ConfigError(
            f"EngineConfig.max_model_len={config.max_model_len} is invalid: the model's "
            f"max_position_embeddings is {max_pos} ({config.model}/config.json)"
        )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: str | Path, given: bool = False):
    """The checkpoint's tokenizer through transformers, or None when the directory has none (``given``: the
    directory was given as the tokenizer's, ``EngineConfig.tokenizer``: it must hold one). A tokenizer file that is
    a broken symbolic link (a copy of the zoo without ``cp -L``) is named. A tokenizer that does not load raises
    ``ConfigError`` naming the file that is not valid JSON, else the directory."""
    path = Path(path)
    for name in TOKENIZER_FILES:
        if (path / name).is_symlink() and not (path / name).exists():
            raise ConfigError(
                f"{path / name} is a broken symbolic link (to {os.readlink(path / name)}): copy the "
                "checkpoint with its links followed (cp -L)"
            )
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        if given:
            raise ConfigError(
                f"EngineConfig.tokenizer={str(path)!r} is invalid: no {', '.join(TOKENIZER_FILES)} there"
            )
        return None
    from transformers import AutoTokenizer

    check_chat_template_field(path / "tokenizer_config.json")
    try:
        # NOTE: the engine refuses a prompt longer than its context itself; transformers' own limit
        # (model_max_length) would only log a warning of indexing errors that cannot happen here.
        tokenizer = AutoTokenizer.from_pretrained(str(path), model_max_length=sys.maxsize)
    except Exception as error:  # noqa: BLE001 - explained below, naming the file (parsed again on failure only)
        for name in TOKENIZER_JSON_FILES:
            if (path / name).is_file():
                read_json_object(path / name)
        raise ConfigError(
            f"{path}: the tokenizer cannot be loaded by transformers: {error}"
        ) from error
    check_chat_templates(tokenizer, path)
    return tokenizer


def check_chat_template_field(config_file: Path) -> None:
    """tokenizer_config.json's ``chat_template``, where given, is a template or a list of named ones
    (``[{"name": "default", "template": ...}, {"name": "tool_use", ...}]``, transformers' form): anything else
    failed inside transformers (a KeyError 'name') or at the first chat (a template of 5)."""
    if not config_file.is_file():
        return
    fields = ConfigFields(read_json_object(config_file), str(config_file))
    value = fields.get("chat_template")
    named = isinstance(value, list) and all(
        isinstance(t, dict)
        and isinstance(t.get("name"), str)
        and isinstance(t.get("template"), str)
        for t in value
    )
    if value is not None and not (isinstance(value, str) or named):
        raise fields.fail(
            "chat_template",
            value,
            "a Jinja template (a string) or a list of {'name': str, 'template': str} objects",
        )


def check_chat_templates(tokenizer, path: Path) -> None:
    """Each chat template of ``tokenizer`` parses as transformers renders it (the one that did not failed each
    chat with a 400 blaming the request's messages), else ``ConfigError`` naming its file: chat_template.jinja and
    additional_chat_templates/NAME.jinja take the place of tokenizer_config.json's field (transformers'
    ``from_pretrained``)."""
    templates = tokenizer.chat_template
    if not templates:
        return
    from transformers.utils.chat_template_utils import _compile_jinja_template

    for name, template in templates.items() if isinstance(templates, dict) else [(None, templates)]:
        try:
            _compile_jinja_template(template)
        except Exception as error:  # noqa: BLE001 - jinja's TemplateSyntaxError, with its line
            line = getattr(error, "lineno", None)
            at = f" (line {line})" if line else ""
            raise ConfigError(
                f"{chat_template_source(path, name)} is not a valid chat template{at}: {error}"
            ) from None


def chat_template_source(path: Path, name: str | None) -> str:
    """Where the tokenizer in ``path`` took its chat template ``name`` (None: its one template) from."""
    if name not in (None, "default") and (path / "additional_chat_templates").is_dir():
        return str(path / "additional_chat_templates" / f"{name}.jinja")
    if name in (None, "default") and (path / "chat_template.jinja").is_file():
        return str(path / "chat_template.jinja")
    which = "" if name is None else f" (the template named {name!r})"
    return f"{path / 'tokenizer_config.json'}: field 'chat_template'{which}"


def eos_token_ids(model_config: ModelConfig, tokenizer, model_dir: str | Path) -> set[int]:
    """The tokens that end a request: config.json's, generation_config.json's (transformers' ``generate`` and vLLM
    stop on those too, and an instruct model's end of turn may be there alone: Meta-Llama-3-8B-Instruct's adds
    <|eot_id|> 128009 to config.json's 128001), and the tokenizer's when it names one."""
    ids = set(model_config.eos_token_ids)
    generation = Path(model_dir) / "generation_config.json"
    if generation.is_file():
        fields = ConfigFields(read_json_object(generation), str(generation))
        ids.update(eos_token_ids_of(fields))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def refuse_experts_off_the_kernels(model: torch.nn.Module) -> None:
    """Captured steps need every mixture on the grouped kernels: experts they do not take (a quantized format or
    shape they lack, layers/quant/experts.py ``grouped_kernels_take``) run one by one behind a host sync."""
    names = experts_off_the_kernels(model)
    if names:
        more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
        raise ConfigError(
            f"the experts of {names[0]}{more} run one by one on the GPU (their activation or quantized "
            "format is not one the grouped kernels take), which a captured CUDA graph cannot hold: serve "
            "with --enforce-eager (EngineConfig.cuda_graphs=False)"
        )


def builds_routed_experts(model_config: ModelConfig) -> bool:
    """Whether the target's family builds routed experts for this config, decided before any weight is read:
    the model built on the meta device (no memory; seconds for DeepSeek-V3's 671B), as models/loader.py
    ``load_part`` builds what it does not load. The family's own constructor decides, so no family's rule
    (DeepSeek's first_k_dense_replace and moe_layer_freq, the Qwen mixtures' mlp_only_layers, Nemotron-H's
    layer types, Step-3.5's moe_layers_enum, Gemma 4's enable_moe_block, ...) is restated here."""
    model = build_model(model_config, torch.float32, "meta")
    return any(isinstance(m, RoutedExperts) for m in model.modules())


def refuse_expert_parallel_without_experts(config: EngineConfig, model_config: ModelConfig) -> None:
    """Expert parallelism places routed experts over its ranks: a model with none (a dense one)
    would have each rank run the whole model for nothing. Refused before the weights load
    (``builds_routed_experts``); every rank decides alike, leaving no rank waiting for another in a
    collective."""
    if config.expert_parallel_size > 1 and not builds_routed_experts(model_config):
        raise ConfigError(
            f"EngineConfig.expert_parallel_size={config.expert_parallel_size} is invalid: the "
            f"model in {config.model} has no routed experts (a dense model) to place over its "
            f"ranks; use expert_parallel_size 1 (tensor_parallel_size shards a dense model)"
        )


def request_rows(config: EngineConfig, max_pos: int, reserved: int) -> int:
    """The KV rows a request's block-table row covers: the model's context and the ``reserved`` rows past it
    that its drafts keep, within a fixed pool's rows (no request reaches past them)."""
    rows = max_pos + reserved
    if not config.kv_blocks_from_memory:
        rows = min(rows, (config.num_kv_blocks or CPU_KV_BLOCKS) * config.block_size)
    return rows


def table_blocks(config: EngineConfig, max_pos: int) -> int:
    """The entries of a request's block-table row, the rows its drafts reserve left out (not known before the
    drafter is built): a bound from below."""
    return -(-request_rows(config, max_pos, 0) // config.block_size)


def refuse_too_many_states(
    config: EngineConfig, model: torch.nn.Module, max_pos: int, dtype: torch.dtype
) -> None:
    """A hybrid target's ``refuse_too_many_seqs``, its sequences' recurrent state counted (with a snapshot
    for each node the largest draft shape verifies), before the drafter or the state rows are allocated."""
    shapes = draft_shapes(config.speculative) if config.speculative.enabled else (DraftShape(0),)
    state = recurrent_state_bytes(model.model, shapes[-1].num_nodes, dtype)
    if state:
        refuse_too_many_seqs(config, SequenceRows(table_blocks(config, max_pos), state))


def load_target(
    config: EngineConfig, model_config: ModelConfig, dtype: torch.dtype, progress: bool
) -> torch.nn.Module:
    """The target model, its weights reported; refused when its sequences' recurrent state cannot fit,
    or when CUDA graphs could not hold its experts; on the CPU, the thread count set for its size."""
    model = load_model(
        config.model, dtype, config.device, progress=progress, load_format=config.load_format
    )
    refuse_too_many_states(config, model, model_config.max_position_embeddings, dtype)
    report(weights_summary(model, model_config.quantization), progress)
    if config.device.startswith("cuda") and config.cuda_graphs:
        refuse_experts_off_the_kernels(model)
    if config.device == "cpu":
        configure_threads(sum(p.numel() for p in model.parameters()))
    return model


def kv_cache_dtype(
    config: EngineConfig,
    model_config: ModelConfig,
    model: torch.nn.Module,
    dtype: torch.dtype,
    progress: bool,
) -> torch.dtype:
    """The paged KV cache's dtype, reported; for an FP8 cache, the layers' k/v scales loaded: the
    checkpoint's, else 1.0 (kv_scales.py)."""
    kv_dtype = resolve_kv_cache_dtype(config.kv_cache_dtype, dtype)
    if is_fp8(kv_dtype):
        load_kv_scales(model, None if config.load_format == "dummy" else config.model)
    calibrated = getattr(model_config.quantization, "kv_cache_quant_algo", None)
    report(
        f"KV cache dtype: {str(kv_dtype).removeprefix('torch.')}"
        + (
            f" (the checkpoint has {calibrated} KV-cache scales: --kv-cache-dtype fp8 uses them)"
            if calibrated and not is_fp8(kv_dtype)
            else ""
        ),
        progress,
    )
    return kv_dtype


def _profile_tokens(config: EngineConfig, max_pos: int) -> int:
    """The tokens of the profile forward that sizing from memory measures."""
    return min(config.max_num_batched_tokens, max_pos - 1)


def provisional_pool(config: EngineConfig, max_pos: int) -> BlockPool:
    """The pool the models are built over: sized from memory, first one holding one profile forward
    (engine/memory.py, ``size_kv_pool``); otherwise the configured number of blocks, for good."""
    blocks = (
        -(-_profile_tokens(config, max_pos) // config.block_size)
        if config.kv_blocks_from_memory
        else config.num_kv_blocks or CPU_KV_BLOCKS
    )
    return BlockPool(blocks, config.block_size)


def refuse_too_many_rows(
    config: EngineConfig,
    model: torch.nn.Module,
    max_pos: int,
    dtype: torch.dtype,
    proposer: Proposer,
    shapes: tuple[DraftShape, ...],
    ram: int,
) -> None:
    """``refuse_too_many_seqs`` once the drafter is built, before the request table and a hybrid target's state
    rows are allocated: each sequence's block-table row with the rows its drafts reserve, the target's recurrent
    state and the drafter's rows (``drafter_row_bytes``), on the CPU against ``ram``, the RAM available before the
    drafter was built (its rows, allocated already, count as they do on the GPU)."""
    reserved = proposer.lookahead + 1  # (as LLMEngine._build reserves them)
    blocks = -(-request_rows(config, max_pos, reserved) // config.block_size)
    state = recurrent_state_bytes(model.model, shapes[-1].num_nodes, dtype)
    rows = SequenceRows(blocks, state, drafter_row_bytes(proposer))
    refuse_too_many_seqs(config, rows, ram)


def build_proposer(
    config: EngineConfig,
    model: torch.nn.Module,
    pool: BlockPool,
    dtype: torch.dtype,
    backend: str,
    max_pos: int,
) -> tuple[Proposer | None, tuple[DraftShape, ...], int]:
    """The proposer (None without speculation), the draft shapes it may draft and its lookahead (the rows
    its drafts reach past a request's last token); the target is told which hidden states to keep for it.
    Refused when every sequence's rows, the drafter's counted, cannot fit (``refuse_too_many_rows``)."""
    spec = config.speculative
    if not spec.enabled:
        return None, (DraftShape(0),), 0
    ram = available_ram()  # (before the drafter's weights and rows)
    proposer = proposer_class(spec.method)(
        spec,
        model,
        pool,
        config.max_num_seqs,
        dtype=dtype,
        device=config.device,
        attention_backend=backend,
    )
    model.set_aux_hidden_state_layers(proposer.aux_layer_ids)
    shapes, lookahead = draft_shapes(spec), proposer.lookahead
    if lookahead >= POSITIONS_PAST_CONTEXT:
        raise ConfigError(
            f"SpeculativeConfig num_steps={spec.num_steps}, topk={spec.topk}, num_draft_tokens="
            f"{spec.num_draft_tokens} is invalid: its drafts reach {lookahead} rows past a "
            f"request's last token, at most {POSITIONS_PAST_CONTEXT - 1} are supported"
        )
    refuse_too_many_rows(config, model, max_pos, dtype, proposer, shapes, ram)
    return proposer, shapes, lookahead


def build_choosers(shapes: tuple[DraftShape, ...], group: RankGroup) -> dict:
    """Adaptive speculation (several draft shapes): one draft-shape chooser per sampling mode (acceptance
    and step costs differ between them); with several ranks, rank 0's choice is every rank's."""
    if len(shapes) == 1:
        return {}
    choosers = {
        mode: DraftLengthChooser(list(shapes), probe_budget=PROBE_BUDGET) for mode in SamplingMode
    }
    if group.size > 1:
        choosers = {mode: DriverChoice(c, group) for mode, c in choosers.items()}
    return choosers


def check_decode_fits_a_batch(config: EngineConfig, decode_tokens: int) -> None:
    """With speculation, one request's decode step (``decode_tokens`` verified tokens) fits the token budget."""
    if config.speculative.enabled and config.max_num_batched_tokens < decode_tokens:
        raise ConfigError(
            f"EngineConfig.max_num_batched_tokens={config.max_num_batched_tokens} is invalid: "
            f"must be >= num_draft_tokens={decode_tokens}"
        )


def decode_buckets(
    config: EngineConfig, decode_tokens: int, recurrent: bool, warn: bool = False
) -> tuple[int, ...]:
    """The batch buckets of the captured decode steps (engine/cuda_graphs.py): none larger than a decode step can
    ever be (``largest_decode_batch``; ``recurrent``: a hybrid target). Sizes of ``cuda_graph_sizes`` above that
    are dropped, with ``warn`` a warning naming them, as vLLM drops capture sizes above max_num_batched_tokens
    with one (``VllmConfig._set_cudagraph_sizes``); a batch no bucket holds runs eagerly. The same on every rank
    (the configuration and the model decide)."""
    largest = largest_decode_batch(
        config.max_num_seqs,
        config.max_num_batched_tokens,
        decode_tokens,
        config.run_ahead,
        recurrent,
    )
    sizes = config.cuda_graph_sizes
    buckets = batch_buckets(config.max_num_seqs, sizes, largest)
    if warn and sizes is not None and len(buckets) < len(sizes):
        logger.warning(
            "EngineConfig.cuda_graph_sizes %s: no decode step holds more than %d requests (max_num_batched_tokens="
            "%d, %d tokens a decoding request), so sizes %s are not captured; %s",
            list(sizes),
            largest,
            config.max_num_batched_tokens,
            decode_tokens,
            [n for n in sizes if n > largest],
            f"captured: {list(buckets)}" if buckets else "every decode step runs eagerly",
        )
    return buckets


def _graph_tokens(config: EngineConfig, decode_tokens: int, recurrent: bool) -> int:
    """The tokens of the largest captured forward, a decode step or a prefill key's chunks (0: none is captured)."""
    if not (config.device.startswith("cuda") and config.cuda_graphs):
        return 0
    prefill = key_tokens(prefill_buckets(config.max_num_batched_tokens), config.max_num_seqs)
    largest = max(decode_buckets(config, decode_tokens, recurrent), default=0)
    return max(largest * decode_tokens, prefill)


def size_kv_pool(
    config: EngineConfig,
    runner: ModelRunner,
    pool: BlockPool,
    group: RankGroup,
    max_pos: int,
    decode_tokens: int,
    reserved: int,
    progress: bool,
) -> MemoryPlan:
    """Size the pool from memory (engine/memory.py), every rank taking the same count, and say what was
    chosen. ``reserved``: the rows past a request's context kept for its drafts."""
    context = (config.max_model_len or max_pos) + reserved
    plan = plan_kv_pool(
        runner,
        pool,
        runner.device,
        config.memory_utilization,
        _profile_tokens(config, max_pos),
        _graph_tokens(config, decode_tokens, runner.has_recurrent_state),
        config.max_num_seqs * pool.blocks_needed(context),
    )
    plan = dataclasses.replace(plan, num_blocks=agree_across_ranks(plan.num_blocks, group))
    refuse_too_small(
        plan,
        pool.blocks_needed(2 + reserved),
        config.block_size,
        config.memory_utilization_field,
    )
    resize_kv_pool(runner, pool, plan.num_blocks)
    report(plan.summary(config.block_size), progress)
    return plan


def set_up_prefix_cache(
    config: EngineConfig,
    runner: ModelRunner,
    proposer: Proposer | None,
    pool: BlockPool,
) -> tuple[str | None, StateCheckpoints | None]:
    """Give the pool a prefix cache unless the configuration turns it off or the models cannot use one, and a
    hybrid target its state checkpoints (allocated now, before the KV pool is sized from what memory is left):
    (why it is off, None when on; the checkpoints' index, None without recurrent state)."""
    enable = config.enable_prefix_caching
    checkpoints = 0  # recurrent-state checkpoints (hybrid targets only)
    if not runner.has_recurrent_state and config.num_state_checkpoints:
        raise ConfigError(
            f"EngineConfig.num_state_checkpoints={config.num_state_checkpoints} (--num-state-checkpoints) is "
            f"invalid: {config.model} has no recurrent layers, whose states it keeps; leave it out"
        )
    if runner.has_recurrent_state:
        checkpoints = config.num_state_checkpoints
        checkpoints = config.max_num_seqs if checkpoints is None else checkpoints
    refusal = proposer.prefix_caching_refusal() if proposer is not None else None
    if refusal is None and runner.has_recurrent_state and not checkpoints:
        refusal = "the target has recurrent layers and EngineConfig.num_state_checkpoints is 0"
    if refusal is None and runner.has_recurrent_state and config.batch_invariant:
        # NOTE: a hybrid prompt's prefill cut at a checkpoint (or started from one) has other bits than the
        # same prompt's in one piece, and where it is cut depends on the drafter (its read-ahead in the keys):
        # MTP's log-probabilities then left plain decoding's on the H100 (benchmarks/results/gpu_2026-12-07b)
        refusal = (
            "the target has recurrent layers and EngineConfig.batch_invariant is set (a prompt cut at "
            "its state checkpoints gets other bits)"
        )
    if enable and refusal:
        raise ConfigError(f"EngineConfig.enable_prefix_caching=True is invalid: {refusal}")
    if enable is False:
        return "turned off by enable_prefix_caching=False", None
    if refusal:
        report(f"prefix caching is off: {refusal}", False)
        return refusal, None
    pool.prefix_cache = PrefixCache(config.block_size, proposer.kv_reads_ahead if proposer else 0)
    if not checkpoints:
        return None, None
    runner.states.allocate_checkpoints(checkpoints)
    report(
        f"prefix caching keeps {checkpoints} recurrent-state checkpoints of "
        f"{runner.states.state_bytes_per_request / (1 << 20):.1f} MiB",
        False,
    )
    return None, StateCheckpoints(checkpoints)


def context_limit(
    config: EngineConfig, max_pos: int, pool: BlockPool, reserved: int, progress: bool
) -> tuple[str, int]:
    """What sets the context (the model, the KV cache less its ``reserved`` rows, or ``max_model_len``:
    the smallest) and the tokens it holds, reported; refused when less than ``max_model_len``, or when a fixed
    pool holds no request (``refuse_too_small``'s bound for a pool sized from memory)."""
    limits = {
        "max_position_embeddings": max_pos,
        f"the KV cache ({pool.num_blocks} blocks of {config.block_size})": pool.num_blocks
        * config.block_size
        - reserved,
    }
    if config.max_model_len:
        limits["max_model_len"] = config.max_model_len
    limit = min(limits, key=limits.get)
    if limit.startswith("the KV cache") and limits[limit] < 2:
        drafts = f" (past the {reserved} rows its drafts reserve)" if reserved else ""
        raise ConfigError(
            f"EngineConfig.num_kv_blocks={config.num_kv_blocks} is invalid: {limit} holds "
            f"{max(limits[limit], 0)} tokens for a request{drafts}, which needs 2 (a prompt token and "
            "one to generate): raise num_kv_blocks or block_size"
        )
    if config.max_model_len and limits[limit] < config.max_model_len:
        raise ConfigError(
            f"EngineConfig.max_model_len={config.max_model_len} is invalid: the context holds "
            f"{limits[limit]} tokens, set by {limit}"
        )
    report(f"the context holds {limits[limit]} tokens (set by {limit})", progress)
    return limit, limits[limit]
