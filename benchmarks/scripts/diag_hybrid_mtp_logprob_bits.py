"""Where MTP's log-probabilities leave plain decoding's in batch-invariant mode on a hybrid target on the GPU
(tests/gpu/test_batch_invariant_hybrids_gpu.py's MTP case, a strict xfail until gpu_2026-12-03d): the zoo's tinyqwen35 in bf16, eager, batch 1,
the test's 4 prompts and 48 greedy tokens with 2 log-probabilities. For each prompt, plain decoding and MTP
(2 steps) each record

- every decoder layer's input stream row and the last layer's output at each position (the target's
  auxiliary hidden-state capture, which the fused few-row path serves too: forward hooks on the layers' parts
  do not fire there, so gpu_2026-11-30b call 4's hooks compared prefill rows only; MTP: the last forward that
  computed the position, the one whose token was kept), and
- the logits rows and tokens each log-probability came from (``token_logprobs``'s calls; MTP's verify rows
  past a request's bonus token, token 0 at node 0, are skipped by matching the emitted tokens in order),

- every gated DeltaNet step launch (layers/deltanet_step_kernel.py ``deltanet_step``, wrapped): its
  projections' rows, its output rows, and the sequence's state rows before and after (the snapshots too),

then prints the first output position whose token or log-probability differs and, at the position that
produced it, whether the logits row and the layer streams differ (and by how much), and for the first layer
whose output differs there, whether its step's inputs (projections, the state the token starts from) or its
output differ: the projections, the step kernel or out_proj.

    PYTHONPATH=. python3 benchmarks/scripts/diag_hybrid_mtp_logprob_bits.py"""

from __future__ import annotations

import json
from pathlib import Path

import torch

import outpace.engine.decode_step as decode_step
import outpace.engine.prefill as prefill
import outpace.layers.deltanet_step_kernel as step_kernel
from outpace import LLM, SamplingParams
from outpace.config import SpeculativeConfig

ZOO = Path(__file__).resolve().parents[2] / "zoo"


def record(spec: SpeculativeConfig, prompts: list[str]) -> list[dict]:
    """Per prompt: its token ids, logprobs (the chosen token's), layer rows by (position, part), and the
    logits row behind each output position."""
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
    )
    target = llm.engine.model
    rows: dict = {}
    calls: list = []
    steps: list = []  # the DeltaNet step launches, in order
    current: dict = {}
    target.register_forward_pre_hook(lambda m, args: current.update(positions=args[1].tolist()))

    layers = len(target.model.layers)
    target.set_aux_hidden_state_layers(
        tuple(range(layers + 1))
    )  # every layer's input, the last output

    def keep(module, args, out) -> None:
        streams = out.aux_hidden_states.view(out.hidden_states.shape[0], layers + 1, -1)
        for j, position in enumerate(current["positions"]):
            for layer in range(layers + 1):
                name = f"{layer}.{'output' if layer == layers else 'input'}"
                rows[(position, name)] = streams[j, layer].detach().float().clone()

    target.register_forward_hook(keep)
    conv_layer = {
        m.conv1d.weight.data_ptr(): i
        for i, layer in enumerate(target.model.layers)
        for m in layer.modules()
        if hasattr(m, "step_kernel")
    }
    real_step = step_kernel.deltanet_step

    def step_recorded(rows_in, conv_weight, *args):
        recurrent, states, snapshots = args[6], args[7], args[8]  # (deltanet_step's order)
        row = int(recurrent.state_indices[0])
        before = {k: v[row].detach().clone() for k, v in states.items()}
        out = real_step(rows_in, conv_weight, *args)
        steps.append(
            dict(
                layer=conv_layer[conv_weight.data_ptr()],
                positions=list(current["positions"]),
                inputs={n: getattr(rows_in, n).detach().clone() for n in ("qkv", "z", "b", "a")},
                out=out.detach().clone(),
                before=before,
                after={k: v[row].detach().clone() for k, v in states.items()},
                kept={k: v[row].detach().clone() for k, v in snapshots.items()}
                if recurrent.snapshots
                else None,
            )
        )
        return out

    step_kernel.deltanet_step = step_recorded
    originals = {module: module.token_logprobs for module in (decode_step, prefill)}
    for module, real in originals.items():

        def wrapped(logits, tokens, k, real=real):
            calls.append((logits.detach().float().clone(), tokens.detach().clone()))
            return real(logits, tokens, k)

        module.token_logprobs = wrapped
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2)
    runs = []
    try:
        for prompt in prompts:
            rows.clear()
            calls.clear()
            out = llm.generate([prompt], params)[0]
            tokens = list(out.token_ids)
            chosen = [pos[t].logprob for t, pos in zip(tokens, out.logprobs)]
            logits, at = [], 0  # the logits row behind each output position, in order
            for block, ids in calls:
                for row, token in zip(block, ids.tolist()):
                    if at < len(tokens) and token == tokens[at]:
                        logits.append(row)
                        at += 1
            runs.append(
                dict(tokens=tokens, logprobs=chosen, rows=dict(rows), logits=logits, prompt=prompt)
            )
            runs[-1]["steps"] = list(steps)
            steps.clear()
    finally:
        for module, real in originals.items():
            module.token_logprobs = real
        step_kernel.deltanet_step = real_step
    return runs


def diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if torch.equal(a, b):
        return "equal"
    return f"max |diff| {(a - b).abs().max().item():.3g} in {(a != b).sum().item()} of {a.numel()}"


def step_at(steps: list[dict], layer: int, position: int) -> tuple[dict, int] | None:
    """The last step launch of ``layer`` that computed ``position`` (the kept one), and the position's run
    index in it."""
    for record in reversed(steps):
        if record["layer"] == layer and position in record["positions"]:
            return record, record["positions"].index(position)
    return None


def start_state(record: dict, j: int) -> dict:
    """The state token j of the launch started from: the row before the launch, or token j - 1's snapshot."""
    if j == 0:
        return record["before"]
    return {k: v[j - 1] for k, v in record["kept"].items()}


def compare_step(plain: list[dict], mtp: list[dict], layer: int, position: int) -> None:
    """The step launches of ``layer`` at ``position`` in the two runs: inputs, start state, output."""
    found = step_at(plain, layer, position), step_at(mtp, layer, position)
    if None in found:
        print(
            f"  layer {layer} at {position}: no step launch recorded (not a DeltaNet layer, or prefill)"
        )
        return
    (p, i), (m, j) = found
    print(
        f"  layer {layer}'s step at {position}: plain run index {i} of {len(p['positions'])}, MTP {j} of {len(m['positions'])}"
    )
    for name in p["inputs"]:
        print(f"    projections {name}: {diff(p['inputs'][name][i], m['inputs'][name][j])}")
    if j > 0 and m["kept"] is None:
        print("    MTP's start state: not kept (no snapshots)")
    else:
        a, b = start_state(p, i), start_state(m, j)
        for k in a:
            print(f"    start state {k}: {diff(a[k], b[k])}")
    print(f"    step output row: {diff(p['out'][i], m['out'][j])}")


def main() -> None:
    prompts = json.loads((ZOO / "eval_prompts.json").read_text())["prompts"][:4]
    plain = record(SpeculativeConfig(), prompts)
    mtp = record(SpeculativeConfig("mtp", num_steps=2), prompts)
    for i, (p, m) in enumerate(zip(plain, mtp)):
        first = next(
            (
                j
                for j in range(len(p["tokens"]))
                if p["tokens"][j] != m["tokens"][j] or p["logprobs"][j] != m["logprobs"][j]
            ),
            None,
        )
        print(
            f"prompt {i}: tokens equal {p['tokens'] == m['tokens']}; first differing output {first}; "
            f"logits rows kept {len(p['logits'])} / {len(m['logits'])} of {len(p['tokens'])}"
        )
        if first is None:
            continue
        print(f"  logprob {p['logprobs'][first]!r} against {m['logprobs'][first]!r}")
        print(
            f"  logits row at {first}: "
            + (
                diff(p["logits"][first], m["logits"][first])
                if first < min(len(p["logits"]), len(m["logits"]))
                else "not kept"
            )
        )
        # the position whose row produced output ``first``: the last prompt token's, plus first
        position = max(pos for pos, _ in p["rows"]) - len(p["tokens"]) + 1 + first
        names = sorted({n for _, n in p["rows"]}, key=lambda n: (int(n.split(".")[0]), n))
        differing = [
            (q, n)
            for q in range(position + 1)
            for n in names
            if (q, n) in p["rows"]
            and (q, n) in m["rows"]
            and not torch.equal(p["rows"][(q, n)], m["rows"][(q, n)])
        ]
        compared = sum(1 for key in p["rows"] if key[0] <= position and key in m["rows"])
        print(f"  layer streams up to position {position}: {len(differing)} of {compared} differ")
        for q, n in differing[:6]:
            print(f"    position {q} {n}: {diff(p['rows'][(q, n)], m['rows'][(q, n)])}")
        if differing:  # the first layer whose output differs there: its input is the stream before
            q, n = differing[0]
            compare_step(p["steps"], m["steps"], int(n.split(".")[0]) - 1, q)


if __name__ == "__main__":
    main()
