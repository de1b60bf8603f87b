"""Hugging Face checkpoint directories: safetensors or PyTorch ``.bin`` (single file or sharded),
load; safetensors, save.

Loading checks every tensor against the model: a tensor the model lacks, a parameter the
checkpoint lacks, a wrong shape, or a shard the index names but the directory lacks each raise
``CheckpointError`` naming the tensor and the file.

Tensor parallelism: a parameter marked with a ``shard`` (distributed/sharding.py ``Shard``) is this
rank's part of the checkpoint tensor; only that part is read (safetensors ``get_slice`` reads the
selected bytes alone).

``.bin`` files (pickled state dicts, e.g. the original EAGLE-3 release's ``pytorch_model.bin``) are
read with ``torch.load(weights_only=True)``: the unpickler rebuilds only tensors and plain containers
and refuses any other object, so a checkpoint cannot run code when it is loaded.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

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
    (sharded, single or any ``*.safetensors``), else ``pytorch_model.bin`` (sharded or single)."""
    model_dir = Path(model_dir)
    index = _index_file(model_dir)
    if index is not None:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index} names shard(s) that are missing from {model_dir}: {', '.join(missing)}")
        return files
    for single in (SINGLE_FILE, BIN_SINGLE_FILE):
        if (model_dir / single).is_file():
            return [model_dir / single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files, {BIN_SINGLE_FILE} or {BIN_INDEX_FILE} in {model_dir}")
    return files


def _index_file(model_dir: Path) -> Path | None:
    for name in (INDEX_FILE, BIN_INDEX_FILE):
        if (model_dir / name).is_file():
            return model_dir / name
    return None


class _PickledShard:
    """A ``.bin`` shard's tensors, with safetensors' ``keys()`` / ``get_tensor(name)`` interface."""

    def __init__(self, path: Path) -> None:
        try:  # weights_only: tensors and plain containers only, never arbitrary objects
            state = torch.load(path, map_location="cpu", weights_only=True)
        except (pickle.UnpicklingError, RuntimeError, EOFError) as e:
            raise CheckpointError(f"{path} cannot be read as a state dict of tensors with "
                                  f"torch.load(weights_only=True): {e}") from e
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise CheckpointError(f"{path} does not hold a state dict (a dict of tensor name -> tensor)")
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
        return set(json.loads(index.read_text())["weight_map"])
    names: set[str] = set()
    for path in checkpoint_files(model_dir):
        with open_shard(path) as f:
            names.update(f.keys())
    return names


def load_checkpoint(model: nn.Module, model_dir: str | Path, progress: bool = True, part: str | None = None) -> None:
    """Copy a checkpoint's tensors into ``model``'s parameters and persistent buffers (converting
    dtype). Every parameter must be in the checkpoint; a persistent buffer (e.g. a draft's vocabulary
    map) keeps its default when absent.

    The model may define ``checkpoint_name(param_name) -> str`` (name map) and
    ``ignored_checkpoint_tensors`` (regexes of checkpoint tensors to skip).
    A tied head (same Parameter as the embedding) is one parameter, so a checkpoint's duplicate
    ``lm_head.weight`` is skipped when the model ties it.

    ``part``: only the parameters and buffers of that submodule (e.g. "mtp_layers") are loaded, and the
    checkpoint's other tensors are skipped unread.
    """
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    wanted = (lambda name: True) if part is None else (lambda name: name.startswith(f"{part}."))
    params = {to_ckpt(name): p for name, p in model.named_parameters() if wanted(name)}
    persistent = set(model.state_dict().keys())
    buffers = {to_ckpt(name): b for name, b in model.named_buffers() if name in persistent and wanted(name)}
    all_names = {to_ckpt(name) for name, _ in model.named_parameters(remove_duplicate=False)}
    ignored = [re.compile(p) for p in getattr(model, "ignored_checkpoint_tensors", ())]
    seen: set[str] = set()
    files = checkpoint_files(model_dir)
    for path in tqdm(files, desc="loading weights", unit="shard", disable=not progress or len(files) < 2):
        with open_shard(path) as f:
            for name in f.keys():
                if any(r.search(name) for r in ignored) or (name in all_names and name not in params):
                    continue
                if name not in params and name not in buffers:
                    if part is not None:
                        continue
                    raise CheckpointError(f"unexpected tensor {name!r} in {path.name}: the model has no such parameter")
                param = params.get(name, buffers.get(name))
                tensor = _read(f, name, path, param)
                with torch.no_grad():
                    param.copy_(tensor.to(param.dtype))
                seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise CheckpointError(f"checkpoint {model_dir} lacks tensor(s) {shown}")


def _read(f, name: str, path: Path, param: torch.Tensor) -> torch.Tensor:
    """The checkpoint tensor ``name`` of shard file ``f``, or this rank's part of it when ``param`` is
    sharded, checked against ``param``'s shape."""
    shard = getattr(param, "shard", None)
    if shard is None:
        tensor = f.get_tensor(name)
        if tuple(tensor.shape) != tuple(param.shape):
            raise CheckpointError(f"tensor {name!r} in {path.name} has shape {tuple(tensor.shape)}, "
                                  f"the model expects {tuple(param.shape)}")
        return tensor
    part = f.get_slice(name)
    full = tuple(part.get_shape()) if hasattr(part, "get_shape") else tuple(part.shape)
    expected = list(param.shape)
    expected[shard.dim] = shard.full
    if full != tuple(expected):
        raise CheckpointError(f"tensor {name!r} in {path.name} has shape {full}, the model expects "
                              f"{tuple(expected)} (of which this rank holds {tuple(param.shape)})")
    return shard.read(part, full)


def model_state_dict(model: nn.Module, parameters: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Parameters under their checkpoint names (a tied head appears once, as the embedding). ``parameters``:
    name -> tensor in place of ``model.named_parameters()`` (e.g. FSDP's shards gathered whole)."""
    to_ckpt = getattr(model, "checkpoint_name", lambda n: n)
    items = parameters.items() if parameters is not None else model.named_parameters()
    return {to_ckpt(name): p.detach() for name, p in items}


def save_checkpoint(tensors: dict[str, torch.Tensor], out_dir: str | Path, max_shard_bytes: int = 2 << 30,
                    dtype: torch.dtype | None = None) -> list[Path]:
    """Write safetensors shards of at most ``max_shard_bytes`` (plus an index when sharded)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        t = (t.to(dtype) if dtype is not None else t).contiguous().cpu()
        nbytes = t.numel() * t.element_size()
        if nbytes > max_shard_bytes:
            raise CheckpointError(f"tensor {name!r} ({nbytes} bytes) is larger than the shard limit {max_shard_bytes}")
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
        (out_dir / INDEX_FILE).write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return [out_dir / n for n in names]
