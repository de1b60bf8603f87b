"""Sharded saving and loading round-trips; dtypes convert on load; the zoo target matches transformers."""

import json
from pathlib import Path

import pytest
import torch

from outpace.checkpoint import checkpoint_files, model_state_dict, save_checkpoint
from outpace.models.loader import load_model

ZOO_TARGET = Path(__file__).resolve().parents[2] / "zoo" / "tinypy"


def test_sharded_save_roundtrip(tmp_path, llama_dir):
    model = load_model(llama_dir, torch.float32)
    files = save_checkpoint(
        model_state_dict(model), tmp_path, max_shard_bytes=40_000, dtype=torch.bfloat16
    )
    assert len(files) > 1 and all(f.stat().st_size <= 40_000 + 4096 for f in files)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {f.name for f in files}
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    assert checkpoint_files(tmp_path) == sorted(files)
    reloaded = load_model(tmp_path, torch.float32)
    for (name, a), (_, b) in zip(model.named_parameters(), reloaded.named_parameters()):
        torch.testing.assert_close(b, a.to(torch.bfloat16).float(), msg=name)


def test_a_tensor_stored_in_two_shards_is_refused(tmp_path, llama_dir):
    """Two copies of one tensor, in two shards: which is meant is not the loader's guess (it read the last, found
    by fuzzing the loader); the error names both files."""
    from safetensors.torch import load_file, save_file

    from outpace.checkpoint import CheckpointError

    model = load_model(llama_dir, torch.float32)
    files = save_checkpoint(model_state_dict(model), tmp_path, max_shard_bytes=40_000)
    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    first, last = load_file(files[0]), load_file(files[-1])
    name = next(iter(first))
    save_file({**last, name: torch.full_like(first[name], 0.01)}, files[-1])
    with pytest.raises(CheckpointError, match=f"{name}.*twice.*{files[0].name}.*{files[-1].name}"):
        load_model(tmp_path, torch.float32)


def test_zoo_target_matches_transformers():
    """The shipped target loads in transformers (MTP weights ignored) and the logits agree."""
    from transformers import AutoModelForCausalLM

    from outpace.attention import DenseCausalMetadata, forward_context

    hf = AutoModelForCausalLM.from_pretrained(ZOO_TARGET, dtype=torch.float32).eval()
    ours = load_model(ZOO_TARGET, torch.float32)
    ids = torch.randint(0, 4096, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), forward_context(DenseCausalMetadata(1, 64)):
        ref = hf(ids).logits[0]
        logits = ours.compute_logits(ours(ids[0], torch.arange(64)).hidden_states)
    assert ((logits - ref).norm() / ref.norm()).item() < 1e-4


class _RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (exec, ("raise SystemExit('unpickling ran code')",))


def test_bin_checkpoints_load_only_tensors(tmp_path, llama_dir):
    """pytorch_model.bin loads like model.safetensors; a pickle that would run code is refused
    (torch.load weights_only=True) with an error naming the file, and a non-state-dict too."""
    from safetensors.torch import load_file

    from outpace.checkpoint import CheckpointError

    (tmp_path / "config.json").write_text((llama_dir / "config.json").read_text())
    torch.save(load_file(llama_dir / "model.safetensors"), tmp_path / "pytorch_model.bin")
    reference, reloaded = load_model(llama_dir, torch.float32), load_model(tmp_path, torch.float32)
    for (name, a), (_, b) in zip(reference.named_parameters(), reloaded.named_parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
    torch.save(
        {"model.embed_tokens.weight": _RunsCodeWhenUnpickled()}, tmp_path / "pytorch_model.bin"
    )
    with pytest.raises(CheckpointError, match="pytorch_model.bin.*weights_only=True"):
        load_model(tmp_path, torch.float32)
    torch.save([torch.zeros(2)], tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="does not hold a state dict"):
        load_model(tmp_path, torch.float32)


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("sharded_dim", [None, 0, 1, 2])
def test_a_parameter_with_a_checkpoint_swap_reads_either_order(tmp_path, sharded_dim, blocks):
    """A parameter marked ``checkpoint_swap`` = (1, 2) reads its tensor stored in its own order or with dims 1
    and 2 swapped (Qwen3-VL-MoE's expert stacks), this rank's part of it too (a shard along any dim, of
    packed blocks); another shape is refused naming the tensor."""
    from safetensors.torch import save_file

    from outpace.checkpoint import CheckpointError, _read, open_shard
    from outpace.distributed.sharding import Shard

    # [experts, 2 * inter, hidden]; a shard: the second half of each block
    full = torch.arange(4 * 8 * 6, dtype=torch.float32).reshape(4, 8, 6)
    shard = None
    if sharded_dim is not None:
        size = full.shape[sharded_dim] // (2 * blocks)
        shard = Shard(sharded_dim, size, size, full.shape[sharded_dim], blocks=blocks)
    expected = full if shard is None else shard.read(full, tuple(full.shape))
    for order, stored in (("own", full), ("swapped", full.transpose(1, 2).contiguous())):
        param = torch.nn.Parameter(torch.empty_like(expected))
        param.shard, param.checkpoint_swap = shard, (1, 2)
        save_file({"w": stored}, str(tmp_path / f"{order}.safetensors"))
        with open_shard(tmp_path / f"{order}.safetensors") as f:
            assert torch.equal(_read(f, "w", tmp_path / f"{order}.safetensors", param), expected)
    save_file({"w": full[:, :, :5].contiguous()}, str(tmp_path / "bad.safetensors"))
    with open_shard(tmp_path / "bad.safetensors") as f, pytest.raises(CheckpointError, match="'w'"):
        _read(f, "w", tmp_path / "bad.safetensors", param)
