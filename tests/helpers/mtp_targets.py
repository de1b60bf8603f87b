"""A toy target with chained MTP layers far from the target: something for the MTP recipe to learn."""

import shutil

import torch
from safetensors.torch import load_file, save_file


def write_mtp_target(out, trained):
    """A toy tinypy (2 layers, 3 chained MTP layers) in ``out`` whose tied embedding is scaled up 4x (peaked
    next-token distributions, as a trained target's are) and whose MTP layers' eh_proj are scrambled (far from
    the target: something to learn). ``trained``: the directory ``train_target(TargetRecipe.toy(steps=30), ...)``
    wrote (conftest's ``trained_toy_target(2)``), copied into ``out`` and changed there."""
    shutil.copytree(trained, out, dirs_exist_ok=True)
    tensors = load_file(out / "model.safetensors")
    tensors["model.embed_tokens.weight"] = tensors["model.embed_tokens.weight"] * 4
    g = torch.Generator().manual_seed(0)
    for k in range(2, 5):
        w = tensors[f"model.layers.{k}.eh_proj.weight"]
        tensors[f"model.layers.{k}.eh_proj.weight"] = (torch.randn(w.shape, generator=g) * 0.3).to(
            w.dtype
        )
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
