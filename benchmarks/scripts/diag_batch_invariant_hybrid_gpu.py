"""Where batch-invariant mode loses bit-identity between MTP and plain decoding on a hybrid target on the GPU: the
zoo's tinyqwen35 in bf16, eager (hooks do not run inside CUDA graphs), one prompt, greedy; forward hooks on the
target's mixers, MLPs and final norm keep each module's output row at each position (MTP: the last forward that
computed the position, the one whose token was kept), then the first position and module whose rows differ.

    PYTHONPATH=. python3 benchmarks/scripts/diag_batch_invariant_hybrid_gpu.py [more LLM kwargs as k=v]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def record(spec: SpeculativeConfig, **kwargs) -> tuple[dict, list[int], list[str]]:
    cuda = torch.cuda.is_available()  # (the CPU: a check of this script)
    llm = LLM(
        str(ZOO / "tinyqwen35"),
        speculative=spec,
        device="cuda" if cuda else "cpu",
        dtype="bfloat16" if cuda else "float32",
        batch_invariant=True,
        max_num_seqs=1,
        cuda_graphs=False,
        num_kv_blocks=128,
        **kwargs,
    )
    target = llm.engine.model
    model = target.model
    rows: dict[tuple[int, str], torch.Tensor] = {}
    current = {}
    target.register_forward_pre_hook(lambda m, args: current.update(positions=args[1].tolist()))
    names = []

    def keep(name: str):
        def hook(module, args, out) -> None:
            out = out[0] if isinstance(out, tuple) else out  # a norm's (normed, residual)
            for j, position in enumerate(current["positions"]):
                rows[(position, name)] = out[j].detach().clone()

        return hook

    for i, layer in enumerate(model.layers):
        for part in ("linear_attn", "self_attn", "mlp", "input_layernorm"):
            if hasattr(layer, part):
                names.append(f"{i}.{part}")
                getattr(layer, part).register_forward_hook(keep(names[-1]))
    prompt = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][0]
    out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    return rows, out[0].token_ids, names


def main() -> None:
    kwargs = dict(a.split("=", 1) for a in sys.argv[1:])
    plain, plain_tokens, names = record(SpeculativeConfig(), **kwargs)
    mtp, mtp_tokens, _ = record(SpeculativeConfig("mtp", num_steps=2), **kwargs)
    print(f"tokens equal: {plain_tokens == mtp_tokens}")
    order = {n: k for k, n in enumerate(names)}
    differing = sorted(
        (key for key in plain if key in mtp and not torch.equal(plain[key], mtp[key])),
        key=lambda key: (key[0], order[key[1]]),
    )
    if not differing:
        print("every recorded row is equal")
        return
    for position, name in differing[:8]:
        a, b = plain[(position, name)].float(), mtp[(position, name)].float()
        print(
            f"position {position} {name}: max |diff| {(a - b).abs().max().item():.3g}, "
            f"{(a != b).sum().item()} of {a.numel()} elements differ"
        )


if __name__ == "__main__":
    main()
