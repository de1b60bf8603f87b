"""Plain decoding's tokens/s with and without ``--batch-invariant`` on the Llama-3.1-8B shape (random bf16
weights, CUDA graphs: outpace/bench/gpu.py's builder and decode timer), or on the seed families' public shapes
(``--shapes``: bench/family_shapes.py, built as bench/families.py builds them; ``--layers N`` cuts a shape to its
first N layers, e.g. the Kimi-K2 slice to 1 dense + 1 MoE layer, 36 GB, for an 80 GB card), at batch 1 and 8: the
mode's cost (issue 43 item 8: the target is within 15% of the normal path).

    python benchmarks/scripts/batch_invariant_speed.py [--contexts 512 4096] [--shapes qwen3.5,...] [--layers N]
        [--out FILE.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import traceback
from pathlib import Path

import torch

from outpace.bench.gpu import build_8b, time_decode

BATCHES = (1, 8)


def build(shape: str | None, workdir: Path, max_context: int, invariant: bool, layers: int | None):
    """The Llama-3.1-8B shape (``shape`` None), or a family shape of bench/family_shapes.py (its first ``layers``
    layers where given)."""
    if shape is None:
        return build_8b(
            workdir, max_context=max_context, max_num_seqs=max(BATCHES), batch_invariant=invariant
        )
    from outpace.bench import families
    from outpace.bench.family_shapes import family_shapes, slice_layers

    if max_context > families.CONTEXT:
        raise ValueError(f"family shapes are built for contexts up to {families.CONTEXT}")
    config = family_shapes()[shape].config
    if layers is not None:
        if layers > config["num_hidden_layers"]:
            raise ValueError(f"--layers {layers}: {shape} has {config['num_hidden_layers']} layers")
        config = slice_layers(config, layers)
    return families.build(workdir, config, max(BATCHES), BATCHES, batch_invariant=invariant)


def set_split_rows(rows: int) -> None:
    """The mode's KV rows per split, for attention and MLA alike (module settings read at each launch)."""
    from outpace.attention import invariant_attention, mla_kernels

    invariant_attention._INVARIANT_SPLIT_ROWS = mla_kernels.invariant_split_rows = rows


def measure(
    contexts: list[int],
    steps: int,
    shape: str | None = None,
    split_rows: list[int] | None = None,
    layers: int | None = None,
) -> list[dict]:
    """One engine per mode (built, timed, freed in turn), the mode's once per ``split_rows`` (None: as
    shipped): a row per (mode, split rows, batch, context)."""
    rows = []
    modes = [(False, None)] + [(True, r) for r in split_rows or [None]]
    with tempfile.TemporaryDirectory() as tmp:
        for invariant, split in modes:
            if split is not None:
                set_split_rows(split)
            llm = build(shape, Path(tmp) / "target", max(contexts), invariant, layers)
            for context in contexts:
                for batch in BATCHES:
                    r = time_decode(llm, batch, context, steps)
                    label = "normal" if not invariant else f"batch-invariant {split or ''}"
                    rows.append(
                        {
                            "shape": shape or "llama-3.1-8b",
                            "batch_invariant": invariant,
                            "split_rows": split,
                            "layers": layers,
                            **r,
                        }
                    )
                    print(
                        f"{shape or 'llama-3.1-8b'}  {label:>20}  "
                        f"batch {batch:>2}  "
                        f"context {context:>5}  {r['tokens_per_s']:8.1f} tokens/s  "
                        f"{r['step_ms']:6.2f} ms/step",
                        flush=True,
                    )
            llm.close()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[512])
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--out", default=None, help="write the rows here as JSON")
    ap.add_argument(
        "--shapes", default=None, help="comma-separated family shapes (else Llama-3.1-8B)"
    )
    ap.add_argument(
        "--split-rows",
        type=int,
        nargs="+",
        default=None,
        help="the mode's KV rows per split to time (attention and MLA; default: as shipped)",
    )
    ap.add_argument(
        "--layers", type=int, default=None, help="cut each family shape to its first N layers"
    )
    a = ap.parse_args()
    if a.layers is not None and not a.shapes:
        ap.error("--layers cuts a family shape: give --shapes")
    rows = []
    for shape in a.shapes.split(",") if a.shapes else [None]:
        try:
            rows += measure(a.contexts, a.steps, shape, a.split_rows, a.layers)
        except Exception as e:  # one shape's failure must not cost the others' figures
            print(f"{shape}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()  # (where: the Kimi slice's OOM of gpu_2026-12-07b call 4 had no trace)
    normal = {
        (r["shape"], r["batch"], r["context"]): r["tokens_per_s"]
        for r in rows
        if not r["batch_invariant"]
    }
    print("\nbatch-invariant against normal:")
    for r in rows:
        if r["batch_invariant"]:
            base = normal[r["shape"], r["batch"], r["context"]]
            r["relative_to_normal"] = r["tokens_per_s"] / base
            print(
                f"  {r['shape']:<22} {r['split_rows'] or '':>5} batch {r['batch']:>2}  "
                f"context {r['context']:>5}  "
                f"{r['tokens_per_s']:8.1f} against "
                f"{base:8.1f} tokens/s: {r['relative_to_normal'] - 1:+.1%}"
            )
    if a.out:
        Path(a.out).write_text(
            json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
