"""Hugging Face checkpoint directories: safetensors or PyTorch ``.bin`` (single file or sharded),
load; safetensors, save.

Loading checks every tensor against the model: a tensor the model lacks, a parameter the
checkpoint lacks, a wrong shape, a dtype the parameter cannot take, a value that is not finite or a
quantization scale that is negative (weight_checks.py) each raise ``CheckpointError`` naming the
tensor and the file. Before any tensor is read, every weight file is checked readable: an index that
is no valid JSON or names a missing shard, an empty or truncated safetensors file, a ``.bin`` that is
no PyTorch archive each raise ``CheckpointError`` naming the file and what is wrong (headers only:
milliseconds).

Tensor parallelism: a parameter marked with a ``shard`` (distributed/sharding.py ``Shard``) is this
rank's part of the checkpoint tensor; only that part is read (safetensors ``get_slice`` reads the
selected bytes alone). Expert parallelism: a module's ``checkpoint_tensors_elsewhere()`` names (relative to
it) the tensors other ranks hold (layers/moe.py ``RoutedExperts``: the other ranks' experts), skipped
unread.

``.bin`` files (pickled state dicts, e.g. the original EAGLE-3 release's ``pytorch_model.bin``) are
read with ``torch.load(weights_only=True)``: the unpickler rebuilds only tensors and plain containers
and refuses any other object, so a checkpoint cannot run code when it is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import pickle
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

from outpace.validation import ConfigError, read_json_object
from outpace.weight_checks import FinitenessCheck, Loaded, dtype_problem

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# transformers' names for PyTorch pickles (WEIGHTS_INDEX_NAME, WEIGHTS_NAME in transformers/utils/constants)
BIN_INDEX_FILE = "pytorch_model.bin.index.json"
BIN_SINGLE_FILE = "pytorch_model.bin"

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class CheckpointError(ValueError):
    """A checkpoint does not match the model it is loaded into."""


def checkpoint_files(model_dir: str | Path) -> list[Path]:
    """The weight files of a checkpoint directory, in index order: safetensors when there are any
    (sharded, single or any ``*.safetensors``), else ``pytorch_model.bin`` (sharded or single).
    Each is checked readable (``check_readable``)."""
    files = _weight_files(Path(model_dir))
    for path in files:
        check_readable(path)
    return files


def weight_files_named(model_dir: str | Path) -> str:
    """Where a checkpoint's tensor names are read from, for an error to name: its index file when it is sharded,
    else its weight files."""
    index = _index_file(Path(model_dir))
    return str(index) if index is not None else ", ".join(map(str, checkpoint_files(model_dir)))


def _weight_files(model_dir: Path) -> list[Path]:
    index = _index_file(model_dir)
    if index is not None:
        files = [model_dir / n for n in sorted(set(_weight_map(index).values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(
                f"{index} names shard(s) that are missing from {model_dir}: {', '.join(missing)}"
            )
        return files
    for single in (SINGLE_FILE, BIN_SINGLE_FILE):
        if (model_dir / single).is_file():
            return [model_dir / single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"no *.safetensors files, {BIN_SINGLE_FILE} or {BIN_INDEX_FILE} in {model_dir}"
        )
    return files


def _index_file(model_dir: Path) -> Path | None:
    for name in (INDEX_FILE, BIN_INDEX_FILE):
        if (model_dir / name).is_file():
            return model_dir / name
    return None


def _weight_map(index: Path) -> dict[str, str]:
    """An index file's tensor name -> shard file name map."""
    try:
        weight_map = read_json_object(index).get("weight_map")
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"{index}: field 'weight_map' must be an object of tensor name -> file name, "
            f"got {type(weight_map).__name__}"
        )
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise CheckpointError(
                f"{index}: field 'weight_map' gives tensor {name!r} the file {file!r}: "
                f"must be a file name"
            )
    return weight_map


def check_readable(path: Path) -> None:
    """Raise ``CheckpointError`` naming ``path`` and what is wrong unless it is a safetensors file
    whose header reads and whose data it covers, or a ``.bin`` that is a PyTorch archive. Reads
    headers only."""
    problem = _bin_problem(path) if path.suffix == ".bin" else _safetensors_problem(path)
    if problem is not None:
        raise CheckpointError(f"{path}: {problem}")


def _bin_problem(path: Path) -> str | None:
    """torch.save writes a zip archive (before PyTorch 1.6 a pickle: protocol >= 2, byte 0x80 first)."""
    with path.open("rb") as f:
        magic = f.read(4)
    if magic[:1] == b"\x80" or zipfile.is_zipfile(path):
        return None
    if not magic:
        return "is empty (0 bytes)"
    if magic == b"PK\x03\x04":
        return "is truncated: a zip archive without its end"
    return "is not a PyTorch archive (torch.save writes a zip file)"


def _safetensors_problem(path: Path) -> str | None:
    try:
        with safe_open(str(path), framework="pt", device="cpu"):
            return None
    except SafetensorError as error:
        return _refused_safetensors(path, error)


def _refused_safetensors(path: Path, error: SafetensorError) -> str:
    """What is wrong, in words, with a file that safetensors refused with ``error``. The format: an
    8-byte little-endian header length n, n bytes of JSON header giving each tensor's data_offsets
    [begin, end], then the data."""
    size = path.stat().st_size
    if size < 8:
        return f"is {'empty' if not size else 'truncated'} ({size} bytes): not a safetensors file"
    with path.open("rb") as f:
        header_size = int.from_bytes(f.read(8), "little")
        if 8 + header_size > size:
            return (
                f"is truncated or not a safetensors file: its first 8 bytes give a header of "
                f"{header_size} bytes, the file has {size}"
            )
        try:
            header = json.loads(f.read(header_size))
            end = max(
                (t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0
            )
        except (ValueError, TypeError, KeyError, IndexError):
            return f"has a header that is not valid safetensors JSON ({error})"
    if 8 + header_size + end > size:
        return f"is truncated: its tensors end at byte {8 + header_size + end}, the file has {size} bytes"
    return f"is not a valid safetensors file ({error})"


class _PickledShard:
    """A ``.bin`` shard's tensors, with safetensors' ``keys()`` / ``get_tensor(name)`` interface."""

    def __init__(self, path: Path) -> None:
        try:  # weights_only: tensors and plain containers only, never arbitrary objects
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            raise CheckpointError(
                f"{path} cannot be read as a state dict of tensors with "
                f"torch.load(weights_only=True): {e}"
            ) from e
        if not isinstance(state, dict) or not all(
            isinstance(t, torch.Tensor) for t in state.values()
        ):
            raise CheckpointError(
                f"{path} does not hold a state dict (a dict of tensor name -> tensor)"
            )
        self._state = state

    def keys(self):
        return self._state.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        return self._state[name]

    def get_slice(self, name: str) -> torch.Tensor:
        return self._state[name]  # already in memory: indexing it is the slice


@contextlib.contextmanager
def open_shard(path: Path):
    """A weight file's tensors by name (``keys()``, ``get_tensor(name)``): safetensors read lazily,
    a ``.bin`` pickle unpickled whole."""
    if path.suffix == ".bin":
        yield _PickledShard(path)
    else:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            yield f


def checkpoint_tensor_names(model_dir: str | Path) -> set[str]:
    """Every tensor name of a checkpoint (from its index when sharded: no shard is read)."""
    index = _index_file(Path(model_dir))
    if index is not None:
        checkpoint_files(model_dir)  # the shards must exist
        return set(_weight_map(index))
    names: set[str] = set()
    for path in checkpoint_files(model_dir):
        with open_shard(path) as f:
            names.update(f.keys())
    return names


def skips_tensor(model: nn.Module) -> Callable[[str], bool]:
    """Whether the loader skips a checkpoint tensor of this name unread: the model's
    ``ignored_checkpoint_tensors`` (regexes: a multimodal checkpoint's towers, rotary tables)."""
    ignored = [re.compile(p) for p in getattr(model, "ignored_checkpoint_tensors", ())]
    return lambda name: any(r.search(name) for r in ignored)


def load_checkpoint(
    model: nn.Module, model_dir: str | Path, progress: bool = True, part: str | None = None
) -> None:
    """Copy a checkpoint's tensors into ``model``'s parameters and persistent buffers (converting
    dtype). Every parameter must be in the checkpoint; a persistent buffer (e.g. a draft's vocabulary
    map) keeps its default when absent.

    The model may define ``checkpoint_name(param_name) -> str`` (name map) and
    ``ignored_checkpoint_tensors`` (regexes of checkpoint tensors to skip).
    A tied head (same Parameter as the embedding) is one parameter, so a checkpoint's duplicate
    ``lm_head.weight`` is not loaded when the model ties it, and is refused if it differs from the embedding
    (``_refuse_untied_heads``).

    ``part``: only the parameters and buffers of that submodule (e.g. "mtp_layers") are loaded, and the
    checkpoint's other tensors are skipped unread.

    Every tensor is checked for its dtype before the copy and for finite values after it, a quantization
    scale (``scale_names``) for negative ones too (weight_checks.py: one host sync for the whole load).
    """
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    wanted = (lambda name: True) if part is None else (lambda name: name.startswith(f"{part}."))
    params = {to_ckpt(name): p for name, p in model.named_parameters() if wanted(name)}
    persistent = set(model.state_dict().keys())
    buffers = {
        to_ckpt(name): b for name, b in model.named_buffers() if name in persistent and wanted(name)
    }
    all_names = {to_ckpt(name) for name, _ in model.named_parameters(remove_duplicate=False)}
    all_names |= {
        to_ckpt(f"{prefix}.{name}" if prefix else name)
        for prefix, module in model.named_modules()
        for name in getattr(module, "checkpoint_tensors_elsewhere", list)()
    }
    scales = scale_names(model)
    tied = _tied_heads(model, to_ckpt)
    heads: list[tuple[str, Path]] = []  # the tied heads the checkpoint stores, and their files
    ignored = skips_tensor(model)
    seen: dict[str, str] = {}  # tensor -> the file it was read from
    finite = FinitenessCheck()
    files = checkpoint_files(model_dir)
    for path in tqdm(
        files, desc="loading weights", unit="shard", disable=not progress or len(files) < 2
    ):
        with open_shard(path) as f:
            for name in f.keys():
                if ignored(name):
                    continue
                if name in all_names and name not in params:
                    if name in tied and tied[name][0] in params:
                        heads.append((name, path))
                    continue
                if name not in params and name not in buffers:
                    if part is not None:
                        continue
                    raise CheckpointError(
                        f"unexpected tensor {name!r} in {path}: the model has no such parameter"
                    )
                if name in seen:  # (which copy is meant, the index does not say to every reader)
                    raise CheckpointError(
                        f"tensor {name!r} is stored twice, in {seen[name]} and {path}"
                    )
                param = params.get(name, buffers.get(name))
                _load_tensor(f, name, path, param, finite, scale=name in scales)
                seen[name] = str(path)
    missing = sorted(set(params) - set(seen))
    if missing:
        raise CheckpointError(f"checkpoint {model_dir} lacks tensor(s) {_listed(missing)}")
    _refuse_non_finite(finite)
    _refuse_untied_heads(heads, tied)


def _tied_heads(model: nn.Module, to_ckpt) -> dict[str, tuple[str, nn.Parameter]]:
    """The checkpoint name of each head the model ties to its embedding (``lm_head.weight``, the same
    Parameter) -> (the embedding's checkpoint name, that Parameter)."""
    first: dict[int, str] = {}
    tied = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) not in first:
            first[id(param)] = to_ckpt(name)
        elif name.endswith("lm_head.weight"):
            tied[to_ckpt(name)] = (first[id(param)], param)
    return tied


def _refuse_untied_heads(
    heads: list[tuple[str, Path]], tied: dict[str, tuple[str, nn.Parameter]]
) -> None:
    """A checkpoint that stores a head of its own beside the embedding the config ties it to
    (``tie_word_embeddings`` true): a copy of the embedding is fine, another head is refused, since which one
    is meant is ambiguous (transformers 5 keeps the stored head with a warning; vLLM and SGLang drop it)."""
    for name, path in heads:
        embedding, param = tied[name]
        with open_shard(path) as f:
            stored = _read(f, name, path, param)
        if not torch.equal(stored.to(device=param.device, dtype=param.dtype), param.detach()):
            raise CheckpointError(
                f"{path}: tensor {name!r} is a head of its own, not a copy of {embedding!r}, while "
                f"config.json ties the head to the embedding (tie_word_embeddings true): set "
                f"tie_word_embeddings false to use it, or remove it"
            )


def scale_names(model: nn.Module) -> set[str]:
    """The checkpoint names of the model's quantization scales: the tensors its modules name in their
    ``checkpoint_scales`` (relative to the module; layers/quant/), whose values must not be negative either. (Named
    by the module, not marked on the tensor: a tensor's attributes do not survive ``to_empty``.)"""
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    return {
        to_ckpt(f"{prefix}.{name}" if prefix else name)
        for prefix, module in model.named_modules()
        for name in getattr(module, "checkpoint_scales", ())
    }


def _load_tensor(
    f, name: str, path: Path, param: torch.Tensor, finite: FinitenessCheck, scale: bool = False
) -> None:
    """Copy tensor ``name`` of shard file ``f`` into ``param``: its dtype checked before, its values
    queued for the finiteness check after (``scale``: a quantization scale, checked not negative too)."""
    tensor = _read(f, name, path, param)
    problem = dtype_problem(tensor.dtype, param)
    if problem is not None:
        raise CheckpointError(f"{path}: tensor {name!r} {problem}")
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
    reread = functools.partial(_read_again, path, name, param)
    finite.add(Loaded(name, path, param, tensor.dtype, reread, scale))


def _refuse_non_finite(finite: FinitenessCheck) -> None:
    problems = finite.problems()
    if problems:
        (first, problem), others = problems[0], [loaded.name for loaded, _ in problems[1:]]
        also = (
            f" (and {len(others)} more tensor(s) not finite: {_listed(others)})" if others else ""
        )
        raise CheckpointError(f"{first.path}: tensor {first.name!r} {problem}{also}")


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _read_again(path: Path, name: str, param: torch.Tensor) -> torch.Tensor:
    with open_shard(path) as f:
        return _read(f, name, path, param)


def _read(f, name: str, path: Path, param: torch.Tensor) -> torch.Tensor:
    """The checkpoint tensor ``name`` of shard file ``f``, or this rank's part of it when ``param`` is
    sharded, checked against ``param``'s shape. A parameter with ``checkpoint_swap`` = (d0, d1) also reads a
    tensor stored with those two dimensions swapped (transformers' Transpose(check_dims=True) conversions:
    Qwen3-VL-MoE's expert stacks), swapped back; where both orders have one shape, the parameter's wins."""
    shard, swap = getattr(param, "shard", None), getattr(param, "checkpoint_swap", None)
    expected = list(param.shape)
    if shard is not None:
        expected[shard.dim] = shard.full
    expected = tuple(expected)
    part = f.get_slice(name)
    full = tuple(part.get_shape()) if hasattr(part, "get_shape") else tuple(part.shape)
    if full != expected and swap is not None and full == _swapped(expected, swap):
        if shard is not None:  # (this rank's part, read along its dim in the checkpoint's order)
            dim = {swap[0]: swap[1], swap[1]: swap[0]}.get(shard.dim, shard.dim)
            return dataclasses.replace(shard, dim=dim).read(part, full).transpose(*swap)
        return f.get_tensor(name).transpose(*swap)
    if full != expected:
        held = "" if shard is None else f" (of which this rank holds {tuple(param.shape)})"
        raise CheckpointError(
            f"tensor {name!r} in {path} has shape {full}, the model expects {expected}{held}"
        )
    return f.get_tensor(name) if shard is None else shard.read(part, full)


def _swapped(shape: tuple[int, ...], dims: tuple[int, int]) -> tuple[int, ...]:
    out = list(shape)
    out[dims[0]], out[dims[1]] = shape[dims[1]], shape[dims[0]]
    return tuple(out)


def model_state_dict(
    model: nn.Module, parameters: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Parameters under their checkpoint names (a tied head appears once, as the embedding). ``parameters``:
    name -> tensor in place of ``model.named_parameters()`` (e.g. FSDP's shards gathered whole)."""
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    items = parameters.items() if parameters is not None else model.named_parameters()
    return {to_ckpt(name): p.detach() for name, p in items}


def save_checkpoint(
    tensors: dict[str, torch.Tensor],
    out_dir: str | Path,
    max_shard_bytes: int = 2 << 30,
    dtype: torch.dtype | None = None,
) -> list[Path]:
    """Write safetensors shards of at most ``max_shard_bytes`` (plus an index when sharded)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        t = (t.to(dtype) if dtype is not None else t).contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if nbytes > max_shard_bytes:
            raise CheckpointError(
                f"tensor {name!r} ({nbytes} bytes) is larger than the shard limit {max_shard_bytes}"
            )
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    if len(shards) == 1:
        names = [SINGLE_FILE]
    else:
        names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for shard, name in zip(shards, names):
        save_file(shard, str(out_dir / name), metadata={"format": "pt"})
    if len(shards) > 1:
        weight_map = {t: name for shard, name in zip(shards, names) for t in shard}
        total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
        (out_dir / INDEX_FILE).write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    return [out_dir / n for n in names]
