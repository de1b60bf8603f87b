"""Token sampling: logits -> the distribution actually sampled from -> tokens.

Terms
-----
- *processed distribution* (``probs``): the distribution a request really samples from,
  after temperature and the truncation filters. Speculative verification must compare the
  draft against exactly this distribution, so it is exposed on its own
  (:func:`logits_to_probs`) and not hidden inside :func:`sample`.
- *greedy row*: a row whose temperature is below ``GREEDY_EPS``. Its processed
  distribution is the one-hot at ``argmax(logits)`` (first index on ties), so every
  sampling rule below reduces to argmax for it.
- *keys*: per-row random keys (``random_keys``: a request's seed and a counter naming the
  draw). Every random number of a row is a counter-based function of its key, so a request
  gets the same tokens whatever else is in the batch and wherever it sits, eagerly or inside a
  captured CUDA graph. Without keys the default RNG is used.
- *seeded row*: a sampled (not greedy) row of a request with a seed (``SamplingParams.seed``). Its
  token at position p is the Gumbel-max sample ``argmax(log(probs) + G_p)``, where ``G_p``
  (``draw_gumbel``) is i.i.d. Gumbel(0, 1) noise over the vocabulary drawn from the key of (seed, p)
  alone: a token of exactly the processed distribution, and the same token whoever computes it (the
  prefill's last row, any verify node deciding position p, a drafter guessing it). Given its
  noise, a seeded row's distribution is the point mass at that sample (``logits_to_probs`` with
  ``gumbel``), so everything downstream treats it like a greedy row: speculative verification
  becomes exact matching, and the output does not depend on drafts, batch or preemption.

Filter order (documented convention): temperature -> top-k -> top-p -> min-p, each filter
seeing the renormalised output of the previous one; this is Hugging Face transformers'
order. vLLM v1 applies min-p before top-k/top-p. Top-k and min-p commute (both are
thresholds that renormalisation does not move), so the two conventions differ only when
top-p and min-p are both set. Disabled values: ``top_k <= 0`` (stored as 0), ``top_p >=
1``, ``min_p <= 0``.

Ties are resolved by value, never by token id: every filter is "keep tokens whose probability
is >= a per-row threshold" (compared as scaled logits, which float32 keeps apart where a high
temperature's softmax would round them together), so tokens tied with the last kept one are
kept too (top-k may keep more than k tokens when the k-th value is tied; top-p keeps the
smallest most-probable set reaching top_p, plus tokens tied with its least probable member).

Nothing here syncs with the host (no ``.item()``, no data-dependent shapes), so the
functions can be captured in CUDA graphs; the Python-level fast paths read only the
Python flags that :class:`SamplingTensors` computed on the host when it was built.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch import Tensor

from outpace.host_copies import to_device
from outpace.layers.argmax import argmax_last

# Temperatures below this are treated as greedy (argmax), as in vLLM.
GREEDY_EPS = 1e-5
FLOAT32_MAX = torch.finfo(torch.float32).max


def is_greedy(params: Any) -> bool:
    """Whether a request's sampling parameters make it greedy (host-side, no tensors built)."""
    temperature = getattr(params, "temperature", 1.0)
    return temperature is not None and float(temperature) < GREEDY_EPS


def is_seeded(params: Any) -> bool:
    """Whether a request samples seeded rows (module docstring): it has a seed and is not greedy."""
    return getattr(params, "seed", None) is not None and not is_greedy(params)


Keys = Tensor | None  # [n] int64 per-row random keys (``random_keys``), or None: the default RNG


@dataclass
class SamplingTensors:
    """Per-row sampling parameters, on the device, one row per sampled position.

    Fields (``n`` = number of rows):
      temperature  # [n] float32; < GREEDY_EPS means greedy
      top_k        # [n] int64; 0 = disabled (values >= vocab also keep everything)
      top_p        # [n] float32; 1.0 = disabled, keep-mass in (0, 1]
      min_p        # [n] float32; 0.0 = disabled, in [0, 1]
      greedy       # [n] bool; temperature < GREEDY_EPS (derived when not given)
      seeded       # [n] bool; a seeded row (module docstring); none when not given

    Python flags (computed on the host by :meth:`from_params`; conservative defaults when
    the dataclass is built directly, which only costs speed, never correctness):
      all_greedy: every row is greedy -> :func:`sample` is a bare argmax.
      need_top_k / need_top_p / need_min_p: some non-greedy row uses that filter.
      any_seeded: some row may be seeded -> its noise is drawn (False when ``seeded`` is not given).
    """

    temperature: Tensor  # [n] float32
    top_k: Tensor  # [n] int64
    top_p: Tensor  # [n] float32
    min_p: Tensor  # [n] float32
    greedy: Tensor | None = None  # [n] bool
    seeded: Tensor | None = None  # [n] bool
    all_greedy: bool = False
    need_top_k: bool = True
    need_top_p: bool = True
    need_min_p: bool = True
    any_seeded: bool = True

    def __post_init__(self) -> None:
        if self.greedy is None:
            self.greedy = self.temperature < GREEDY_EPS  # [n]
        if self.seeded is None:
            self.seeded = torch.zeros_like(self.greedy)  # [n]
            self.any_seeded = False

    @property
    def num_rows(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def from_params(
        cls, params_list: Sequence[Any], device: torch.device | str
    ) -> "SamplingTensors":
        """Build from objects with ``temperature``, ``top_k``, ``top_p``, ``min_p`` and ``seed``.

        Missing or ``None`` attributes mean "disabled"; ``top_k <= 0`` is stored as 0.
        """
        temps, top_ks, top_ps, min_ps = [], [], [], []
        for params in params_list:
            temperature = getattr(params, "temperature", 1.0)
            top_k = getattr(params, "top_k", None)
            top_p = getattr(params, "top_p", None)
            min_p = getattr(params, "min_p", None)
            # (a temperature past float32's largest would be infinite there, and -inf / inf NaN)
            temps.append(1.0 if temperature is None else min(float(temperature), FLOAT32_MAX))
            top_ks.append(0 if top_k is None or top_k <= 0 else int(top_k))
            top_ps.append(1.0 if top_p is None else float(top_p))
            min_ps.append(0.0 if min_p is None else float(min_p))
        greedy = [is_greedy(params) for params in params_list]
        sampled = [i for i, g in enumerate(greedy) if not g]
        seeded = [is_seeded(params) for params in params_list]
        return cls(
            temperature=to_device(temps, device, torch.float32),
            top_k=to_device(top_ks, device),
            top_p=to_device(top_ps, device, torch.float32),
            min_p=to_device(min_ps, device, torch.float32),
            greedy=to_device(greedy, device, torch.bool),
            seeded=to_device(seeded, device, torch.bool),
            all_greedy=len(sampled) == 0,
            need_top_k=any(top_ks[i] > 0 for i in sampled),
            need_top_p=any(top_ps[i] < 1.0 for i in sampled),
            need_min_p=any(min_ps[i] > 0.0 for i in sampled),
            any_seeded=any(seeded),
        )

    def repeat_interleave(
        self, repeats: int | Tensor, output_size: int | None = None
    ) -> "SamplingTensors":
        """Repeat each row ``repeats`` times (e.g. one request's params for all its draft
        positions). With a tensor ``repeats`` pass ``output_size`` to avoid a host sync.
        The Python flags stay valid: a row subset/repeat cannot add a filter or a sampled row.
        """

        def rep(t: Tensor) -> Tensor:
            if isinstance(repeats, int):
                return t.repeat_interleave(repeats)
            return t.repeat_interleave(repeats, output_size=output_size)

        return replace(
            self,
            temperature=rep(self.temperature),
            top_k=rep(self.top_k),
            top_p=rep(self.top_p),
            min_p=rep(self.min_p),
            greedy=rep(self.greedy),
            seeded=rep(self.seeded),
        )


def _one_hot_argmax(logits: Tensor) -> Tensor:
    """One-hot float32 rows at ``argmax`` (first index on ties).  # [n, V]"""
    index = argmax_last(logits)[:, None]  # [n, 1]
    return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(
        -1, index, 1.0
    )


def logits_to_probs(logits: Tensor, st: SamplingTensors, gumbel: Tensor | None = None) -> Tensor:
    """The processed distribution each row samples from.  # [n, V] float32

    ``logits``  # [n, V]. Steps: divide by temperature -> top-k -> top-p -> min-p ->
    renormalise; greedy rows are the one-hot at ``argmax(logits)``. Each filter is a
    per-row probability threshold (see the module docstring for ties), so the whole chain
    is one sort plus one mask. The most probable token is always kept.
    ``gumbel``  # [n, V]: each row's noise (``draw_gumbel`` of the position it decides); with it,
    seeded rows are the one-hot at their Gumbel-max sample (``gumbel_scores``).
    """
    probs = _processed(logits, st)  # [n, V]
    if gumbel is None or not st.any_seeded:
        return probs
    return torch.where(
        st.seeded[:, None], _one_hot_argmax(gumbel_scores(probs, gumbel)), probs
    )  # [n, V]


def gumbel_scores(probs: Tensor, gumbel: Tensor) -> Tensor:
    """``log(probs) + gumbel``: the scores whose argmax is a Gumbel-max sample of ``probs`` (``-inf`` where a
    token has probability 0, so it is never the argmax).  # [n, V]"""
    return probs.log() + gumbel


def _processed(logits: Tensor, st: SamplingTensors) -> Tensor:
    """``logits_to_probs`` without noise.  # [n, V] float32"""
    logits = logits.float()  # [n, V]
    if st.all_greedy:
        return _one_hot_argmax(logits)
    n, vocab = logits.shape
    temperature = torch.where(st.greedy, 1.0, st.temperature)  # [n] (finite: ``from_params``)
    scaled = logits / temperature[:, None]  # [n, V]
    if not (st.need_top_k or st.need_top_p or st.need_min_p):  # temperature alone: no threshold
        probs = torch.softmax(scaled, dim=-1)  # [n, V]
        return torch.where(st.greedy[:, None], _one_hot_argmax(logits), probs)  # [n, V]

    # Each filter's threshold is on the scaled logits (the order of the probabilities, which a high temperature's
    # float32 softmax rounds into ties: top_k=1 must still keep the most likely token alone).
    threshold = torch.full((n,), float("-inf"), device=logits.device)  # [n]
    if st.need_top_k or st.need_top_p:
        sorted_logits = scaled.sort(dim=-1, descending=True).values  # [n, V]
        sorted_probs = torch.softmax(sorted_logits, dim=-1)  # [n, V]
        # top-k: keep logits >= the k-th largest value.
        k = torch.where(st.top_k > 0, st.top_k.clamp(max=vocab), vocab)  # [n]
        kth = sorted_logits.gather(-1, (k - 1)[:, None]).squeeze(-1)  # [n]
        # top-p on the renormalised top-k distribution: keep sorted position j while the
        # mass strictly before it is < top_p * (top-k mass). No division needed.
        in_top_k = sorted_logits >= kth[:, None]  # [n, V], a prefix
        top_k_probs = sorted_probs * in_top_k  # [n, V]
        cumulative = top_k_probs.cumsum(dim=-1)  # [n, V]
        mass_before = cumulative - top_k_probs  # [n, V]
        keep_mass = st.top_p[:, None] * cumulative[:, -1:]  # [n, 1]
        num_kept = ((mass_before < keep_mass) & in_top_k).sum(dim=-1).clamp(min=1)  # [n]
        num_kept = torch.where(st.top_p >= 1.0, vocab, num_kept)  # [n]
        top_p_threshold = sorted_logits.gather(-1, (num_kept - 1)[:, None]).squeeze(-1)  # [n]
        threshold = torch.maximum(kth, top_p_threshold)  # [n]
    if st.need_min_p:
        # min-p is relative to the max prob, which renormalisation leaves in proportion: p >= min_p * max p
        # is scaled logit >= max + log(min_p) (min_p 0: -inf, no threshold).
        threshold = torch.maximum(threshold, scaled.amax(dim=-1) + st.min_p.log())  # [n]

    # the kept tokens' distribution, renormalised: the softmax over them alone
    probs = torch.softmax(
        scaled.masked_fill(scaled < threshold[:, None], float("-inf")), dim=-1
    )  # [n, V]
    return torch.where(st.greedy[:, None], _one_hot_argmax(logits), probs)  # [n, V]


def _mix64(x: Tensor) -> Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic; logical shifts emulated with a
    mask, since torch shifts int64 arithmetically): a bijection whose outputs look independent for
    consecutive inputs. Constants from Steele, Lea and Flood, "Fast splittable pseudorandom number
    generators" (2014), as in java.util.SplittableRandom.  # same shape as x"""
    for shift, multiplier in (
        (30, -4658895280553007687),
        (27, -7723592293110705685),
    ):  # 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
        x = (x ^ ((x >> shift) & ((1 << (64 - shift)) - 1))) * multiplier
    return x ^ ((x >> 31) & ((1 << 33) - 1))


_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15: splitmix64's increment


def random_keys(seeds: Tensor, counters: Tensor) -> Tensor:
    """Per-row random keys from a request's seed and a counter that names the draw (e.g. the
    position it decides and what for), so that a row's random numbers depend only on these two,
    never on the batch around it or on what ran before: the same in an eager step and a captured
    replay. The counter is mixed (consecutive counters give unrelated keys); ``draw_uniform`` mixes
    the key again with each column.  ``seeds``, ``counters``  # [n] int64 -> [n] int64
    (On CUDA one Triton launch computes the same bits: layers/random_kernel.py.)"""
    if seeds.is_cuda:
        from outpace.layers import random_kernel

        return random_kernel.random_keys(seeds, counters)
    return seeds ^ _mix64(counters * _GOLDEN)


def draw_uniform(
    num_rows: int, num_cols: int, keys: Keys, device: torch.device | str, stream: int = 0
) -> Tensor:
    """U[0, 1) numbers: row i from ``keys[i]`` (counter-based, capturable) when keys are given, else
    the default RNG. ``stream`` separates independent draws made with the same keys.
    # [num_rows, num_cols] float32"""
    if keys is None:
        return torch.rand(num_rows, num_cols, device=device)
    if keys.is_cuda:
        from outpace.layers import random_kernel

        return random_kernel.draw_uniform(keys, num_cols, stream)
    cols = torch.arange(num_cols, dtype=torch.int64, device=keys.device) + stream * (
        1 << 32
    )  # [cols]
    bits = _mix64(keys[:, None] + _GOLDEN * (cols + 1))  # [rows, cols]
    return ((bits >> 40) & ((1 << 24) - 1)).float() * 2.0**-24  # 24 random bits: exact in float32


GUMBEL_STREAM = (
    2  # draw_uniform's stream of the Gumbel noise (0: verify's uniforms, 1: a categorical draw)
)


def draw_gumbel(keys: Tensor, num_cols: int) -> Tensor:
    """Gumbel(0, 1) noise ``-log(-log(u))``, u from ``GUMBEL_STREAM`` of each row's key: a seeded row's noise at the
    position its key names (module docstring). ``keys``  # [n] -> [n, num_cols] float32

    u is clamped away from 0 (probability 2 ** -24) so the noise stays finite: in [-2.9, 16.7].
    (On CUDA one Triton launch computes it: layers/random_kernel.py.)"""
    if keys.is_cuda:
        from outpace.layers import random_kernel

        return random_kernel.draw_gumbel(keys, num_cols, GUMBEL_STREAM)
    u = draw_uniform(
        keys.shape[0], num_cols, keys, keys.device, stream=GUMBEL_STREAM
    )  # [n, num_cols]
    return -torch.log(-torch.log(u.clamp_(min=2.0**-25)))


def sample_from_probs(probs: Tensor, keys: Keys = None) -> Tensor:
    """One categorical draw per row.  # [n] int64

    ``probs``  # [n, V], non-negative, need not be normalised (the draw is proportional).
    Inverse CDF: the first token whose cumulative mass exceeds u * total, u ~ U[0, 1) (one
    number per row: stream 1 of its key). A token of mass 0 adds nothing to the cumulative sum,
    so it is never the first to exceed anything; one-hot rows (greedy) return their hot index.
    """
    cdf = probs.float().cumsum(dim=-1)  # [n, V]
    u = draw_uniform(probs.shape[0], 1, keys, probs.device, stream=1)  # [n, 1]
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [n, 1]
    return token.clamp_(max=probs.shape[1] - 1).squeeze(1)  # [n]


def sample(logits: Tensor, st: SamplingTensors, keys: Keys = None) -> Tensor:
    """Sample one token per row from the processed distribution.  # [n] int64

    ``logits``  # [n, V]. Fast path: when ``st.all_greedy`` (a host-side Python bool),
    a bare argmax with no random numbers drawn. ``keys`` name the position each row decides: a
    seeded row takes the Gumbel-max sample with that position's noise (``draw_gumbel``), the
    others an inverse-CDF draw (``sample_from_probs``); without keys, every row the latter.
    """
    if st.all_greedy:
        return argmax_last(logits)  # [n]
    gumbel = (
        draw_gumbel(keys, logits.shape[-1]) if st.any_seeded and keys is not None else None
    )  # [n, V]
    return sample_from_probs(logits_to_probs(logits, st, gumbel), keys)


class Sampler(torch.nn.Module):
    """Module wrapper around :func:`sample` for use as a model layer."""

    def forward(self, logits: Tensor, st: SamplingTensors, keys: Keys = None) -> Tensor:
        return sample(logits, st, keys)  # [n]
