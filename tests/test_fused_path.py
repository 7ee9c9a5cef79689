"""The other attention paths against the eager reference, with the same random weights: the
fused one (``attn_implementation="sdpa"``, :func:`attention.sdpa_attention`) and the tiled
one (``"tiled"``, :func:`attention.tiled_attention`).

Tolerances: fp32 1e-5 and fp64 1e-12 on logits (only the order of the sums differs).
"""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import attention
from transformer_lib.attention import (
    ATTENTION_FUNCTIONS,
    MultiHeadAttention,
    causal_mask,
    sdpa_attention,
)
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.recording import record_weights

import ledger_plugin
from conftest import randomize_

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


def twin_models(dtype=torch.float32, implementation="sdpa", **overrides) -> tuple[Decoder, Decoder]:
    """An eager decoder and one with ``implementation``, with the same random weights (norm
    weights included)."""
    config = DecoderConfig(**{**dict(vocab_size=64, d_model=64, n_layers=2, n_heads=4,
                                     n_kv_heads=2, d_ff=96, max_seq_len=64), **overrides})
    eager = randomize_(Decoder(config), std=0.1).to(dtype).eval()
    fused = Decoder(dataclasses.replace(config, attn_implementation=implementation))
    fused = fused.to(dtype).eval()
    fused.load_state_dict(eager.state_dict())
    return eager, fused


def chunked(model: Decoder, tokens: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Logits of ``tokens`` fed through one cache in pieces of the given sizes."""
    cache, at, pieces = model.new_cache(tokens.shape[0]), 0, []
    for size in sizes:
        pieces.append(model(tokens[:, at:at + size], cache))
        at += size
    assert cache.pos == at == tokens.shape[1]
    return torch.cat(pieces, dim=1)


HEADS = [(4, 4), (4, 2), (4, 1)]  # MHA, GQA, MQA
IDS = ["MHA", "GQA", "MQA"]


# ---- the decoder: same logits, same tokens ----------------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("implementation", ["sdpa", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_heads, n_kv_heads", HEADS, ids=IDS)
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_full_pass_gives_the_same_logits(n_heads, n_kv_heads, pairing, dtype, implementation, ledger):
    eager, fused = twin_models(dtype, implementation, n_heads=n_heads, n_kv_heads=n_kv_heads,
                               rope_pairing=pairing)
    tokens = torch.randint(0, 64, (3, 40))
    expected = eager(tokens)
    ledger.check(f"decoder logits, {implementation}", "the eager decoder, same weights",
                 fused(tokens), expected, tol=TOL[dtype])
    assert expected.abs().max().item() > 0.1  # logits of a size that would show an error


@pytest.mark.equality
@pytest.mark.parametrize("implementation", ["sdpa", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n_heads, n_kv_heads", HEADS, ids=IDS)
def test_cached_decoding_gives_the_same_logits(n_heads, n_kv_heads, dtype, implementation, ledger):
    """Prefill, then one token at a time (T = 1: no mask), then chunks after a cached prefix
    (T > 1 and cache.pos > 0: the explicit bottom-right mask)."""
    eager, fused = twin_models(dtype, implementation, n_heads=n_heads, n_kv_heads=n_kv_heads)
    tokens = torch.randint(0, 64, (2, 40))
    full = eager(tokens)  # (B, 40, V): the reference, no cache
    sizes = [10] + [1] * 6 + [5, 2, 17]
    for name, model in (("eager", eager), (implementation, fused)):
        ledger.check(f"{name} logits decoded with the cache, 10 + 6 × 1 + 5 + 2 + 17",
                     "the eager full forward pass", chunked(model, tokens, sizes), full,
                     tol=TOL[dtype])


def test_chunk_after_a_prefix_with_top_left_is_causal_would_differ(monkeypatch):
    """What the explicit mask is for: with SDPA's is_causal (top-left) a chunk after a cached
    prefix is wrong, while a prefill from position 0 (square) is not affected."""
    eager, fused = twin_models(torch.float64)
    tokens = torch.randint(0, 64, (2, 30))
    full = eager(tokens)

    def top_left(q, k, v, mask=None, *, causal=False, scale=None, dropout_p=0.0,
                 need_weights=False):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal and q.shape[-2] > 1,
                                              enable_gqa=True), None

    monkeypatch.setitem(ATTENTION_FUNCTIONS, "sdpa", top_left)
    wrong = chunked(fused, tokens, [12, 8, 10])
    assert (wrong[:, :12] - full[:, :12]).abs().max().item() <= 1e-12  # the square prefill
    assert (wrong[:, 12:] - full[:, 12:]).abs().max().item() > 1e-2  # the chunks


@pytest.mark.equality
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_generate_gives_the_same_tokens(pairing, ledger):
    eager, fused = twin_models(rope_pairing=pairing, n_heads=8, n_kv_heads=2)
    prompt = torch.randint(0, 64, (3, 9))
    expected = eager.generate(prompt, 30)
    ledger.check("sdpa greedy tokens, 30 new", "the eager decoder's", fused.generate(prompt, 30),
                 expected, tol=0)
    ledger.check("sdpa greedy tokens without the cache", "the eager decoder's",
                 fused.generate(prompt, 30, use_cache=False), expected, tol=0)
    assert len(expected[0, 9:].unique()) > 1  # not a degenerate run of one token


@pytest.mark.equality
def test_training_gradients_are_the_same(ledger):
    eager, fused = twin_models()
    tokens = torch.randint(0, 64, (2, 24))
    grads = []
    for model in (eager, fused):
        model.train()
        logits = model(tokens)
        F.cross_entropy(logits[:, :-1].reshape(-1, 64), tokens[:, 1:].reshape(-1)).backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    diff = max(ledger_plugin.max_difference(grads[1][name], g) for name, g in grads[0].items())
    ledger.record("gradients of every parameter, sdpa", "the eager decoder's, by autograd",
                  "float32", diff, tol=1e-5)


# ---- sdpa_attention: which mask goes to the kernel ---------------------------------------

def test_the_kernel_gets_no_mask_is_causal_or_a_bottom_right_mask(monkeypatch):
    calls = []
    kernel = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **kwargs):
        calls.append((q.shape[-2], k.shape[-2], attn_mask, is_causal))
        return kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    _, fused = twin_models(n_layers=1)
    chunked(fused, torch.randint(0, 64, (1, 12)), [8, 1, 3])
    (t0, s0, mask0, causal0), (t1, s1, mask1, causal1), (t2, s2, mask2, causal2) = calls
    assert (t0, s0, mask0, causal0) == (8, 8, None, True)  # prefill: square, is_causal
    assert (t1, s1, mask1, causal1) == (1, 9, None, False)  # one token: no mask
    assert (t2, s2, causal2) == (3, 12, False)  # a chunk after 9 cached: explicit mask
    assert torch.equal(mask2, causal_mask(3, 12))
    assert mask2[0].sum() == 10  # query 0 of the chunk sits at position 9: keys 0 … 9


@pytest.mark.equality
def test_mha_paths_agree_with_padding_mask_and_causal(ledger):
    """MultiHeadAttention, eager vs sdpa: a key-padding mask combined with causal, after a
    cached prefix; GQA through the kernel's enable_gqa."""
    eager = randomize_(MultiHeadAttention(32, 4, n_kv_heads=2, bias=False)).double().eval()
    fused = MultiHeadAttention(32, 4, n_kv_heads=2, bias=False, attn_implementation="sdpa")
    fused.double().eval().load_state_dict(eager.state_dict())
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    context = torch.randn(2, 9, 32, dtype=torch.float64)  # a chunk of 5 after 4 earlier
    keep = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    keep[0, ..., :2] = False  # sequence 0: its first two positions are padding
    out = fused(x, context, mask=keep, causal=True)
    expected = eager(x, context, mask=keep, causal=True)
    ledger.check("MultiHeadAttention sdpa, padding + causal after a prefix",
                 "the eager layer, same weights", out, expected, tol=1e-12)
    assert (eager(x, context, mask=keep) - expected).abs().max().item() > 1e-3  # causal bites


@pytest.mark.equality
def test_sdpa_attention_equals_the_written_out_reference(ledger):
    q = torch.randn(2, 6, 7, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 11, 8, dtype=torch.float64)
    v = torch.randn(2, 3, 11, 8, dtype=torch.float64)
    out, weights = sdpa_attention(q, k, v, causal=True)
    assert weights is None  # the kernel never forms them
    expected, _ = attention.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
        mask=torch.ones(7, 11, dtype=torch.bool).tril(diagonal=4))
    ledger.check("sdpa_attention, GQA 6/3, causal after a prefix",
                 "the written-out attention with a bottom-right mask", out, expected, tol=1e-12)


# ---- what the fused path does not have, and bad input -------------------------------------

@pytest.mark.parametrize("implementation", ["sdpa", "tiled"])
def test_weights_are_kept_only_on_the_eager_path(implementation):
    eager, fused = twin_models(implementation=implementation, n_layers=1)
    tokens = torch.randint(0, 64, (2, 6))
    with record_weights(eager), record_weights(fused):
        eager(tokens), fused(tokens)
    assert eager.layers[0].self_attn.last_weights.shape == (2, 4, 6, 6)
    message = (f"not kept with attn_implementation='{implementation}'.*"
               "use attn_implementation='eager'")
    with pytest.raises(RuntimeError, match=message):
        fused.layers[0].self_attn.last_weights


def test_default_is_eager():
    assert DecoderConfig().attn_implementation == "eager"
    assert MultiHeadAttention(16, 2).attn_implementation == "eager"


def test_unknown_implementation_is_rejected():
    message = r"attn_implementation must be one of \('eager', 'sdpa', 'tiled'\), got 'flash'"
    with pytest.raises(ValueError, match=message):
        DecoderConfig(attn_implementation="flash")
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(16, 2, attn_implementation="flash")


def test_bad_sdpa_inputs_are_rejected():
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast"):
        sdpa_attention(q, k, v, torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="causal_mask needs 1 <= T <= S, got T=3, S=2"):
        sdpa_attention(q, k[..., :2, :], v[..., :2, :], causal=True)
    message = r"query heads \(2\) must be a multiple of key/value heads \(3\)"
    with pytest.raises(ValueError, match=message):
        sdpa_attention(q, torch.randn(1, 3, 5, 4), torch.randn(1, 3, 5, 4))
