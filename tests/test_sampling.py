"""The sampling rule (transformer_lib.sampling), tested by the distribution it draws from.

Frequency checks draw N = 60,000 tokens in one call (N rows of the same logits) and accept
a frequency within ±0.01 of its probability. The standard error of a frequency is at most
0.5 / √N ≈ 0.0020 (at p = 0.5), so ±0.01 is at least 4.9 standard errors: a right sampler
fails a token with probability below 1e-6. The draws are seeded, so the result is also the
same on every run. The wrong samplers planted at the end differ from the right distribution
by at least 0.06 on some token, 30 standard errors, so the same checks cannot miss them.
"""
from __future__ import annotations

import math
from typing import Callable

import pytest
import torch

from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.sampling import check_sampling, next_token_probs, sample_next_token

from conftest import randomize_

N = 60_000  # draws per frequency check
TOLERANCE = 0.01  # >= 4.9 standard errors of a frequency over N draws (module docstring)
# Eight tokens, no ties: softmax at τ = 1 is about [.38 .14 .09 .05 .03 .02 .23 .07].
LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, 1.5, 0.25])
V = len(LOGITS)

Sampler = Callable[..., torch.Tensor]


def frequencies(sample: Sampler, logits: torch.Tensor = LOGITS, seed: int = 0,
                **kwargs) -> torch.Tensor:
    """How often each of the V tokens is drawn in N draws from ``logits`` ``(V,)``."""
    rows = logits.expand(N, len(logits))  # (N, V): one draw per row
    tokens = sample(rows, generator=torch.Generator().manual_seed(seed), **kwargs)  # (N, 1)
    assert tokens.shape == (N, 1) and tokens.dtype == torch.long
    return torch.bincount(tokens[:, 0], minlength=len(logits)).double() / N  # (V,)


def far_from(freq: torch.Tensor, probs: torch.Tensor) -> list[str]:
    """The tokens whose frequency is more than TOLERANCE away from its probability."""
    return [f"token {i}: frequency {f:.4f}, probability {p:.4f}"
            for i, (f, p) in enumerate(zip(freq.tolist(), probs.tolist()))
            if abs(f - p) > TOLERANCE]


# The checks: each takes a sampler with the signature of sample_next_token and returns the
# failures it finds (empty: the sampler passes).


def temperature_failures(sample: Sampler) -> list[str]:
    """At τ = 0.5 and τ = 2 the frequencies follow softmax(logits / τ)."""
    failures = []
    for tau in (0.5, 2.0):
        want = torch.softmax(LOGITS.double() / tau, dim=-1)  # (V,)
        failures += [f"τ={tau}: {f}" for f in far_from(frequencies(sample, temperature=tau),
                                                       want)]
    return failures


def top_k_failures(sample: Sampler) -> list[str]:
    """With top_k = 3 only the three most likely tokens are drawn, as often as their
    renormalised probabilities say."""
    top3 = [0, 6, 1]  # logits 2.0, 1.5, 1.0
    want = torch.zeros(V, dtype=torch.float64)
    want[top3] = torch.softmax(LOGITS[top3].double(), dim=-1)  # renormalised over the three
    freq = frequencies(sample, temperature=1.0, top_k=3)
    drawn = set(torch.nonzero(freq).flatten().tolist())
    failures = [] if drawn == set(top3) else [f"top_k=3 drew tokens {sorted(drawn)}"]
    return failures + [f"top_k=3: {f}" for f in far_from(freq, want)]


CHECKS = {"temperature": temperature_failures, "top_k": top_k_failures}


@pytest.mark.parametrize("check", CHECKS)
def test_the_sampler_passes_each_distribution_check(check):
    assert CHECKS[check](sample_next_token) == []


def test_the_frequencies_follow_temperature_and_top_k_together():
    freq = frequencies(sample_next_token, temperature=0.5, top_k=2)
    want = torch.zeros(V, dtype=torch.float64)
    want[[0, 6]] = torch.softmax(LOGITS[[0, 6]].double() / 0.5, dim=-1)  # (2,)
    assert far_from(freq, want) == []
    assert freq[[1, 2, 3, 4, 5, 7]].sum() == 0


# Wrong samplers planted in place of the right one: the checks above must report each.


def always_argmax(logits, **kwargs):
    return logits.argmax(dim=-1, keepdim=True)  # (B, 1): never samples


def temperature_ignored(logits, *, temperature=1.0, **kwargs):
    return sample_next_token(logits, temperature=1.0 if temperature > 0 else 0.0, **kwargs)


def temperature_squared(logits, *, temperature=1.0, **kwargs):
    return sample_next_token(logits, temperature=temperature ** 2, **kwargs)  # logits / τ²


def top_k_as_top_1(logits, *, top_k=None, **kwargs):
    return sample_next_token(logits, top_k=1 if top_k else None, **kwargs)


def top_k_ignored(logits, *, top_k=None, **kwargs):
    return sample_next_token(logits, **kwargs)


@pytest.mark.parametrize("broken, check", [
    (always_argmax, "temperature"),
    (temperature_ignored, "temperature"),
    (temperature_squared, "temperature"),
    (top_k_as_top_1, "top_k"),
    (top_k_ignored, "top_k"),
], ids=lambda x: getattr(x, "__name__", x))
def test_the_checks_catch_a_planted_bug(broken, check):
    assert CHECKS[check](broken), f"{check} check passed {broken.__name__}"


# The distribution itself (next_token_probs), exactly.


@pytest.mark.equality
def test_probs_are_the_softmax_of_logits_over_temperature(ledger):
    logits = torch.randn(5, 11, dtype=torch.float64)
    for tau in (0.3, 1.0, 2.5):
        want = torch.softmax(logits / tau, dim=-1)  # (5, 11)
        ledger.check(f"next-token probabilities, τ = {tau}", ledger.torch("softmax(logits / τ)"),
                     next_token_probs(logits, temperature=tau), want, tol=1e-12)  # fp64


@pytest.mark.equality
def test_probs_are_computed_in_fp32_for_half_logits(ledger):
    logits = torch.randn(3, 50).to(torch.bfloat16)
    probs = next_token_probs(logits, temperature=0.7)
    assert probs.dtype == torch.float32
    want = torch.softmax(logits.float() / 0.7, dim=-1)  # (3, 50)
    ledger.check("next-token probabilities of bf16 logits, τ = 0.7",
                 ledger.torch("softmax") + " in fp32", probs, want, tol=1e-6)  # one softmax


@pytest.mark.equality
def test_top_k_keeps_the_k_largest_and_renormalises(ledger):
    logits = torch.tensor([[0.1, 2.0, -1.0, 1.5, 0.3, 3.0]], dtype=torch.float64)
    probs = next_token_probs(logits, temperature=1.0, top_k=3)  # (1, 6)
    keep = [5, 1, 3]  # logits 3.0, 2.0, 1.5
    want = torch.zeros_like(probs)
    want[0, keep] = torch.softmax(logits[0, keep], dim=-1)
    ledger.check("top-3 probabilities", "softmax over the 3 largest logits", probs, want,
                 tol=1e-12)


def test_top_k_ties_at_the_kth_value_keep_the_smallest_ids():
    # One token above the tie, three tied for second place: top_k = 3 keeps exactly three,
    # the top one and the two tied tokens with the smallest ids.
    logits = torch.tensor([[3.0, 1.0, 2.0, 2.0, 2.0, 0.0]])
    probs = next_token_probs(logits, temperature=1.0, top_k=3)  # (1, 6)
    assert torch.nonzero(probs[0]).flatten().tolist() == [0, 2, 3]
    drawn = frequencies(sample_next_token, logits[0], temperature=1.0, top_k=3)
    assert torch.nonzero(drawn).flatten().tolist() == [0, 2, 3]


def test_greedy_picks_the_first_of_tied_maxima_as_argmax_does():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    assert sample_next_token(logits, temperature=0.0).flatten().tolist() == [1, 0]
    # top_k = 1 sampling keeps the same token as greedy decoding, ties included
    assert next_token_probs(logits, temperature=1.0, top_k=1).argmax(-1).tolist() == [1, 0]
    assert next_token_probs(logits, temperature=1.0, top_k=1)[:, [2, 3]].sum() == 0


def test_temperature_zero_is_the_argmax():
    logits = torch.randn(50, 17)
    assert torch.equal(sample_next_token(logits, temperature=0.0),
                       logits.argmax(dim=-1, keepdim=True))
    probs = next_token_probs(logits, temperature=0.0)  # (50, 17): one-hot
    assert torch.equal(probs.argmax(-1), logits.argmax(-1)) and torch.all(probs.sum(-1) == 1)
    assert torch.all(probs.max(-1).values == 1)


def _support(probs: torch.Tensor) -> list[int]:
    return torch.nonzero(probs[0]).flatten().tolist()


@pytest.mark.equality
def test_top_p_keeps_the_smallest_set_that_reaches_p(ledger):
    # softmax: about [.09 .64 .03 .24]; sorted: 1 (.64), 3 (.24), 0 (.09), 2 (.03)
    logits = torch.tensor([[1.0, 3.0, 0.0, 2.0]], dtype=torch.float64)
    p = torch.softmax(logits[0], dim=-1)
    top2 = float(p[1] + p[3])  # the first two reach about .88
    cases = {0.5: [1], float(p[1]) - 1e-6: [1], float(p[1]) + 1e-6: [1, 3],
             top2 - 1e-6: [1, 3], top2 + 1e-6: [0, 1, 3], 0.999: [0, 1, 2, 3]}
    for top_p, keep in cases.items():
        probs = next_token_probs(logits, temperature=1.0, top_p=top_p)
        assert _support(probs) == keep, top_p
        want = torch.zeros(4, dtype=torch.float64)
        want[keep] = p[keep] / p[keep].sum()  # renormalised over the nucleus
        ledger.check(f"top-p probabilities, p = {top_p:.6f}", "the nucleus renormalised by hand",
                     probs[0], want, tol=1e-12)


def test_top_p_on_an_exact_boundary_stops_at_the_token_that_reaches_it():
    # Four equal logits: probabilities exactly 1/4, cumulative sums exactly 1/4, 1/2, 3/4.
    # p = 1/2 is reached by the second token: two kept (ties: the smallest ids), not three.
    logits = torch.zeros(1, 4)
    assert _support(next_token_probs(logits, top_p=0.5)) == [0, 1]
    assert _support(next_token_probs(logits, top_p=0.75)) == [0, 1, 2]
    assert _support(next_token_probs(logits, top_p=0.25)) == [0]
    assert torch.equal(next_token_probs(logits, top_p=0.5)[0],
                       torch.tensor([0.5, 0.5, 0.0, 0.0]))


def test_top_p_of_one_keeps_every_token_and_a_tiny_p_only_the_argmax():
    logits = torch.tensor([[0.0, 25.0, -30.0, 1.0, -60.0]])  # some probabilities below 1e-7
    every = next_token_probs(logits, top_p=1.0)
    assert torch.equal(every, next_token_probs(logits))
    assert _support(every) == [0, 1, 2, 3, 4]
    assert _support(next_token_probs(logits, top_p=1e-9)) == [1]
    assert torch.equal(sample_next_token(logits.expand(100, 5), top_p=1e-9,
                                         generator=torch.Generator().manual_seed(0)),
                       torch.ones(100, 1, dtype=torch.long))


def test_top_p_applies_to_the_top_k_survivors_renormalised():
    # Probabilities .45, .30, .25. top_k = 2 leaves .6 and .4 after renormalising; the first
    # token alone then reaches p = .5. Over all three tokens it would not (.45 < .5).
    logits = torch.log(torch.tensor([[0.45, 0.30, 0.25]], dtype=torch.float64))
    assert _support(next_token_probs(logits, top_k=2, top_p=0.5)) == [0]
    assert _support(next_token_probs(logits, top_p=0.5)) == [0, 1]


def test_top_p_frequencies_match_the_renormalised_nucleus():
    # τ = 1: tokens 0 (.38) and 6 (.23) hold .61, so p = .6 keeps exactly those two.
    freq = frequencies(sample_next_token, temperature=1.0, top_p=0.6)
    want = next_token_probs(LOGITS[None].double(), top_p=0.6)[0]  # (V,)
    assert _support(want[None]) == [0, 6]
    assert far_from(freq, want) == [] and freq[[1, 2, 3, 4, 5, 7]].sum() == 0


def test_the_same_seed_draws_the_same_tokens():
    logits = torch.randn(200, 30)

    def draw(seed):
        return sample_next_token(logits, temperature=1.3, top_k=10, top_p=0.9,
                                 generator=torch.Generator().manual_seed(seed))

    assert torch.equal(draw(5), draw(5))
    assert not torch.equal(draw(5), draw(6))


@pytest.mark.parametrize("name, value", [
    ("temperature", -0.5), ("temperature", float("nan")), ("temperature", float("inf")),
    ("temperature", "hot"), ("temperature", None), ("temperature", True),
    ("top_k", 0), ("top_k", 9), ("top_k", 2.0), ("top_k", True), ("top_k", "3"),
    ("top_p", 0.0), ("top_p", -0.1), ("top_p", 1.5), ("top_p", float("nan")), ("top_p", "0.9"),
])
def test_an_invalid_setting_names_the_argument_and_the_value(name, value):
    settings = {"temperature": 1.0, "top_k": None, "top_p": None, name: value}
    for call in (lambda: check_sampling(**settings, vocab_size=V),
                 lambda: next_token_probs(LOGITS[None], **settings),
                 lambda: sample_next_token(LOGITS[None], **settings)):
        with pytest.raises(ValueError) as error:
            call()
        message = str(error.value)
        assert message.startswith(name) and str(value) in message, message


def test_bad_logits_and_a_generator_on_another_device_are_named():
    with pytest.raises(ValueError, match=r"logits must be .* \(B, V\), got shape \(8,\)"):
        sample_next_token(LOGITS)
    with pytest.raises(ValueError, match="got shape .*torch.int64"):
        next_token_probs(torch.ones(2, 3, dtype=torch.long))
    on_meta = torch.zeros(2, 5, device="meta")
    with pytest.raises(ValueError, match="generator is on cpu but the logits are on meta"):
        sample_next_token(on_meta, generator=torch.Generator())


# Through the model: Decoder.generate draws its first token from next_token_probs.


def test_generate_draws_its_first_token_from_next_token_probs():
    config = DecoderConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
                           d_ff=32, max_seq_len=8)
    model = randomize_(Decoder(config), std=0.3).eval()
    prompt = torch.tensor([[3, 7, 1]])  # (1, 3)
    with torch.no_grad():
        logits = model(prompt)[:, -1]  # (1, V)
    want = next_token_probs(logits.double(), temperature=0.5)[0]  # (V,)
    assert want.max() < 0.9 and (want > 0.02).sum() >= 3  # a spread the test can see
    out = model.generate(prompt.expand(N, 3), 1, temperature=0.5,
                         generator=torch.Generator().manual_seed(0))  # (N, 4)
    assert torch.equal(out[:, :3], prompt.expand(N, 3))
    freq = torch.bincount(out[:, 3], minlength=config.vocab_size).double() / N  # (V,)
    assert far_from(freq, want) == []


def test_generate_takes_top_p_and_checks_it_first():
    model = Decoder(DecoderConfig()).eval()
    prompt = torch.zeros(1, 4, dtype=torch.long)
    greedy = model.generate(prompt, 5)
    assert torch.equal(model.generate(prompt, 5, temperature=1.0, top_p=1e-9,
                                      generator=torch.Generator().manual_seed(0)), greedy)
    for bad, name in ((dict(temperature=math.nan), "temperature"), (dict(top_p=0.0), "top_p"),
                      (dict(top_k=65), "top_k")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            model.generate(prompt, 3, **bad)
