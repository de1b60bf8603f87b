"""Bytes an expert-parallel MoE moves per decode step: outpace's all-reduce of replicated activations against
an all-to-all dispatch and combine (DeepEP's, SGLang's and vLLM's ``--enable-expert-parallel`` with
data-parallel attention), computed, not measured. ``python -m outpace.distributed.dispatch_bytes`` prints the
DeepSeek-V3 table.

The two schemes, per MoE layer, for ``rows`` token rows (a decode step's batch; times k + 1 for a verify of k
drafts), hidden size H, ``b`` bytes per activation, P ranks, top_k experts per token:
- all-reduce (layers/moe.py): every rank holds every row; each rank's partial output [rows, H] is summed by a
  ring all-reduce, which sends 2 (P - 1) / P x rows x H x b bytes from each rank (reduce-scatter, then
  all-gather).
- all-to-all: each row lives on one rank and is sent to every other rank holding one of its top_k experts
  (once per rank, however many of its experts that rank holds), and each such rank sends its combined
  contribution back: 2 x d x H x b bytes per row, d the expected number of *other* ranks among its
  experts'. With experts spread uniformly, the ranks a row's top_k experts land on are distinct with
  probability 1 - (1 - 1 / P)^top_k each, so d = (P - 1) x (1 - (1 - 1 / P)^top_k) (rows on the rank of
  none of their experts send to all of them). DeepSeek-V3 limits a token to 4 nodes (topk_group), not to
  ranks, so at 8 ranks of one node the bound does not bite.
Per rank, the all-to-all moves its share of the batch (ceil(rows / P) rows), the all-reduce every row's
partial sums. With at least P rows the all-to-all sends d / (P - 1) of the all-reduce's bytes (DeepSeek-V3,
EP 8: 4.6 / 7, about two thirds); below P rows a rank still sends a whole row to d ranks and the all-reduce
sends less (one row: a fifth). DeepSeek-V3 (hidden 7168, 58 MoE layers, top_k 8, bf16) at EP 8, bytes each
rank sends per decode step (``table()``):

    rows     all-reduce     all-to-all
       1        1.46 MB        7.64 MB
       8       11.64 MB        7.64 MB
      32       46.56 MB       30.56 MB

At decode sizes both are tens to hundreds of kilobytes a layer, which NVLink moves in microseconds: the
step is latency-bound, and the all-reduce needs no routing-dependent counts (no host synchronisation, no
padded worst case), so it is captured in the step's CUDA graph as the TP all-reduces are. The all-to-all
pays off with partitioned activations (data-parallel attention, which outpace does not have) at large
batches, or across nodes where bandwidth, not latency, bounds a step.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MoeShape:
    hidden: int
    moe_layers: int
    top_k: int
    activation_bytes: int = 2  # bf16


DEEPSEEK_V3 = MoeShape(hidden=7168, moe_layers=58, top_k=8)  # (61 layers, the first 3 dense)


def other_ranks_per_row(ranks: int, top_k: int) -> float:
    """The expected number of ranks other than its own that hold one of a row's top_k experts (docstring)."""
    return (ranks - 1) * (1 - (1 - 1 / ranks) ** top_k)


def all_reduce_bytes(shape: MoeShape, rows: int, ranks: int) -> float:
    """Bytes each rank sends per decode step (every MoE layer) in the all-reduce scheme."""
    per_layer = 2 * (ranks - 1) / ranks * rows * shape.hidden * shape.activation_bytes
    return per_layer * shape.moe_layers


def all_to_all_bytes(shape: MoeShape, rows: int, ranks: int) -> float:
    """Bytes the busiest rank sends per decode step (every MoE layer) in an all-to-all dispatch and combine:
    its ceil(rows / ranks) rows out, and as many rows' contributions back."""
    own_rows = -(-rows // ranks)
    row_bytes = shape.hidden * shape.activation_bytes
    per_layer = 2 * own_rows * other_ranks_per_row(ranks, shape.top_k) * row_bytes
    return per_layer * shape.moe_layers


def table(shape: MoeShape = DEEPSEEK_V3, ranks: int = 8, batches=(1, 8, 32)) -> str:
    lines = [
        f"hidden {shape.hidden}, {shape.moe_layers} MoE layers, top_k {shape.top_k}, "
        f"{shape.activation_bytes}-byte activations, EP {ranks}: bytes each rank sends per decode step",
        f"{'rows':>6} {'all-reduce':>14} {'all-to-all':>14}",
    ]
    for rows in batches:
        ar, a2a = all_reduce_bytes(shape, rows, ranks), all_to_all_bytes(shape, rows, ranks)
        lines.append(f"{rows:>6} {ar / 1e6:>11.2f} MB {a2a / 1e6:>11.2f} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
