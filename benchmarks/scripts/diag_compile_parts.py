"""Which part of the EAGLE3 training step compiles wrongly: eager against compiled gradients, per part.

The draft has the zoo's shape (over zoo/tinypy), the batch is random tokens through the target. Each variant
compiles a part of the step (the whole step under three backends, or only the losses, the attention or the
TTT forward) and compares its gradients with eager ones on the call that compiles it, then twice more after
moving every weight in place, as an optimizer does. Prints the worst relative gradient error per call and
the compiled forward + backward time. benchmarks/results/train_compile/README.md has the H100 run.

    PYTHONPATH=. python benchmarks/scripts/diag_compile_parts.py [--device cuda] [--batch 128]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from outpace.models.drafts.eagle3 import Eagle3Config
from outpace.train.distill import decayed_weights, response_mask, teacher_forward, weighted_loss
from outpace.train.ranks import ONE_RANK
from outpace.train.recipes import eagle3 as E

SEQ, DRAFT_VOCAB, TTT_STEPS = 192, 2048, 7


def ttt_loss(losses: list[torch.Tensor]) -> torch.Tensor:
    """EAGLE3's loss over its TTT steps, weighed as its recipe weighs them."""
    return weighted_loss(losses, decayed_weights(len(losses), E.STEP_DECAY))


def build(device: str, batch: int):
    """(draft, step inputs) as the recipe builds them, on random tokens."""
    torch.manual_seed(0)
    target = ONE_RANK.load_target(Path("zoo/tinypy"), device)
    tcfg = target.config
    capture = E.default_capture_ids(tcfg.num_hidden_layers)
    target.set_aux_hidden_state_layers(capture)
    vocab_ids = torch.arange(DRAFT_VOCAB)
    recipe = E.Eagle3Recipe()
    cfg = Eagle3Config.from_dict(E.eagle3_config(tcfg, recipe, capture, DRAFT_VOCAB, "llama"))
    draft = E.initial_draft(cfg, target, vocab_ids, recipe, device)
    tokens = torch.randint(3, DRAFT_VOCAB, (batch, SEQ), device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = teacher_forward(target, tokens)
        aux = out.aux_hidden_states.view(batch, SEQ, -1)
        logits = target.compute_logits(out.hidden_states).view(batch, SEQ, -1)
    mask = (
        response_mask(torch.full((batch,), 64, device=device), SEQ) & draft.t2d[logits.argmax(-1)]
    )
    return draft, (
        ONE_RANK.embedding(target, tcfg.vocab_size),
        aux,
        tokens,
        logits[..., vocab_ids.to(device)],
        mask,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--batch", type=int, default=128)
    a = p.parse_args()
    device = a.device
    draft, (embed, aux, tokens, teacher, mask) = build(device, a.batch)
    params = list(draft.parameters())

    def step(forward=E.ttt_forward, attention=E.ttt_attention, losses=E.ttt_losses):
        """One forward + backward with the given parts -> the draft's gradients."""

        def run():
            eager_attention, E.ttt_attention = (
                E.ttt_attention,
                attention,
            )  # ttt_forward looks it up in the module
            try:
                with torch.autocast(device, dtype=torch.bfloat16):
                    outputs = forward(draft, embed, aux, tokens, TTT_STEPS)
                    loss = ttt_loss(losses(draft, outputs, teacher, mask)[0])
                return torch.autograd.grad(loss, params)
            finally:
                E.ttt_attention = eager_attention

        return run

    def whole(**options):
        compiled = torch.compile(
            lambda d: E.ttt_losses(
                d, E.ttt_forward(d, embed, aux, tokens, TTT_STEPS), teacher, mask
            )[0],
            dynamic=False,
            **options,
        )

        def run():
            with torch.autocast(device, dtype=torch.bfloat16):
                loss = ttt_loss(compiled(draft))
            return torch.autograd.grad(loss, params)

        return run

    def compiled(fn):
        return torch.compile(fn, dynamic=False)

    variants = {
        "whole inductor": lambda: whole(),
        "whole aot_eager": lambda: whole(backend="aot_eager"),
        "whole no buffer reuse": lambda: whole(options={"allow_buffer_reuse": False}),
        "losses only": lambda: step(losses=compiled(E.ttt_losses)),
        "attention only": lambda: step(attention=compiled(E.ttt_attention)),
        "forward only": lambda: step(forward=compiled(E.ttt_forward)),
    }
    eager = step()
    start_weights = [p.detach().clone() for p in params]

    def worst_error(got, want) -> float:
        return max(((g - w).norm() / w.norm().clamp(min=1e-12)).item() for g, w in zip(got, want))

    def milliseconds(fn, n: int = 10) -> float:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        if device == "cuda":
            torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t) / n

    print(f"eager ms {milliseconds(eager):.1f}", flush=True)
    for name, make in variants.items():
        with torch.no_grad():
            for p, w in zip(params, start_weights):
                p.copy_(w)
        t0 = time.perf_counter()
        fn = make()
        errors = [worst_error(fn(), eager())]
        first_call = time.perf_counter() - t0
        for _ in range(2):
            with torch.no_grad():
                for p in params:
                    p.add_(0.02 * torch.randn_like(p))
            errors.append(worst_error(fn(), eager()))
        print(
            f"{name:24} first call {first_call:6.1f}s  worst grad rel: {' '.join(f'{e:.2e}' for e in errors)}  "
            f"ms {milliseconds(fn):.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
