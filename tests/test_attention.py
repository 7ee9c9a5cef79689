"""Attention: the written-out reference, masks, the dispatch table of implementations, and
the multi-head layer, against PyTorch (fp32 1e-5) and an independent reference (fp64 1e-12)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib import attention
from transformer_lib.attention import (
    ATTENTION_FUNCTIONS,
    ATTN_IMPLEMENTATIONS,
    MultiHeadAttention,
    attention_mask,
    causal_mask,
    repeat_kv,
    scaled_dot_product_attention,
)
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.validation import zero_rows_without_keys

from conftest import randomize_

# fp32 comparisons: ~1e-6 relative error per op over a few ops -> 1e-5 absolute on O(1) values.
ATOL = 1e-5


SDPA = "F.scaled_dot_product_attention"
MHA = "nn.MultiheadAttention"
WRITTEN_OUT = "softmax(s q kᵀ) v written out in the test"


@pytest.mark.equality
def test_matches_torch_sdpa_with_and_without_mask(ledger):
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8)
    v = torch.randn(2, 3, 7, 6)  # Dv differs from D (claim C1)
    out, w = scaled_dot_product_attention(q, k, v)
    ledger.check("attention output, Dv != D", ledger.torch(SDPA), out,
                 F.scaled_dot_product_attention(q, k, v), tol=ATOL)
    assert torch.allclose(w.sum(-1), torch.ones(2, 3, 5), atol=1e-6)  # claim C2
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True  # every query sees at least one key
    out, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    # F.scaled_dot_product_attention's boolean attn_mask uses the same convention: True = attend.
    ledger.check("attention output with a boolean mask", ledger.torch(SDPA), out,
                 F.scaled_dot_product_attention(q, k, v, attn_mask=mask), tol=ATOL)


@pytest.mark.equality
def test_scale_uses_head_dim(ledger):
    q, k, v = torch.randn(1, 4, 64), torch.randn(1, 6, 64), torch.randn(1, 6, 64)
    _, w = scaled_dot_product_attention(q, k, v)
    expected = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)  # √64 = 8 (claim C1)
    ledger.check("attention weights, scale 1/√64", "softmax(q kᵀ / 8) written out", w, expected,
                 tol=1e-6)


def test_masked_positions_get_exactly_zero_weight():
    q, k, v = torch.randn(1, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
    _, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(4))
    assert (w[0].triu(1) == 0).all()  # claim C7
    assert torch.allclose(w.sum(-1), torch.ones(1, 4), atol=1e-6)


def test_fully_masked_row_gives_zeros_not_nan():
    q, k, v = torch.randn(3, 8), torch.randn(5, 8), torch.randn(5, 4)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask=mask)
    assert not torch.isnan(out).any()
    assert (w[1] == 0).all() and (out[1] == 0).all()
    assert torch.allclose(w[0].sum(), torch.tensor(1.0))


def test_causal_mask_square_and_with_cached_prefix():
    assert torch.equal(causal_mask(4), torch.ones(4, 4, dtype=torch.bool).tril())
    m = causal_mask(2, 5)  # 3 cached positions, queries at absolute positions 3 and 4
    assert torch.equal(m, torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))
    assert torch.equal(causal_mask(3, 7), causal_mask(7)[-3:])


def test_repeat_kv_interleaves_heads():
    x = torch.randn(2, 3, 5, 4)
    r = repeat_kv(x, 2)
    assert r.shape == (2, 6, 5, 4)
    assert torch.equal(r, torch.repeat_interleave(x, 2, dim=1))
    assert torch.equal(r[:, 1], x[:, 0]) and torch.equal(r[:, 2], x[:, 1])  # not tiled
    assert repeat_kv(x, 1) is x


@pytest.mark.equality
def test_gqa_matches_torch_sdpa_enable_gqa(ledger):
    q, k, v = torch.randn(2, 8, 5, 16), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    ours, _ = scaled_dot_product_attention(q, repeat_kv(k, 4), repeat_kv(v, 4), mask=causal_mask(5))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ledger.check("repeat_kv then attention, 8 query / 2 kv heads, causal",
                 ledger.torch(SDPA + "(enable_gqa=True)"), ours, ref, tol=ATOL)


def _from_torch_mha(ref: nn.MultiheadAttention) -> MultiHeadAttention:
    ours = MultiHeadAttention(ref.embed_dim, ref.num_heads, keep_weights=True)
    with torch.no_grad():
        wq, wk, wv = ref.in_proj_weight.chunk(3)
        bq, bk, bv = ref.in_proj_bias.chunk(3)
        for proj, w, b in ((ours.q_proj, wq, bq), (ours.k_proj, wk, bk), (ours.v_proj, wv, bv),
                           (ours.o_proj, ref.out_proj.weight, ref.out_proj.bias)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
    return ours


@pytest.fixture
def mha_pair():
    ref = randomize_(nn.MultiheadAttention(32, 4, batch_first=True)).eval()
    return ref, _from_torch_mha(ref).eval()


@pytest.mark.equality
def test_mha_self_attention_matches_torch(mha_pair, ledger):
    ref, ours = mha_pair
    x = torch.randn(2, 6, 32)
    expected, ref_w = ref(x, x, x, average_attn_weights=False)
    ledger.check("MultiHeadAttention, self-attention", ledger.torch(MHA), ours(x), expected,
                 tol=ATOL)
    assert ours.last_weights.shape == (2, 4, 6, 6)
    ledger.check("MultiHeadAttention weights per head", ledger.torch(MHA), ours.last_weights,
                 ref_w, tol=1e-6)


@pytest.mark.equality
def test_mha_cross_attention_matches_torch(mha_pair, ledger):
    ref, ours = mha_pair
    x, memory = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    expected, _ = ref(x, memory, memory)
    ledger.check("MultiHeadAttention, cross-attention", ledger.torch(MHA), ours(x, memory),
                 expected, tol=ATOL)
    assert ours.last_weights.shape == (2, 4, 5, 9)


@pytest.mark.equality
def test_mha_key_padding_matches_torch(mha_pair, ledger):
    ref, ours = mha_pair
    x = torch.randn(2, 6, 32)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[0, 4:] = True  # torch convention: True = padding, ignore
    expected, _ = ref(x, x, x, key_padding_mask=pad)
    got = ours(x, mask=~pad[:, None, None, :])  # ours: True = may attend
    ledger.check("MultiHeadAttention, key padding", ledger.torch(MHA), got, expected, tol=ATOL)
    assert (ours.last_weights[0, :, :, 4:] == 0).all()


@pytest.mark.equality
def test_mha_causal_matches_torch(mha_pair, ledger):
    ref, ours = mha_pair
    x = torch.randn(2, 6, 32)
    torch_mask = nn.Transformer.generate_square_subsequent_mask(6)  # float, -inf above diagonal
    expected, _ = ref(x, x, x, attn_mask=torch_mask)
    ledger.check("MultiHeadAttention, causal mask", ledger.torch(MHA), ours(x, mask=causal_mask(6)),
                 expected, tol=ATOL)


@pytest.mark.equality
def test_mha_gqa_equals_explicit_reference(ledger):
    attn = randomize_(MultiHeadAttention(32, 8, n_kv_heads=2, bias=False)).eval()
    assert attn.k_proj.weight.shape == (8, 32)  # H_kv * D = 2 * 4
    x = torch.randn(2, 5, 32)
    q = attn.q_proj(x).view(2, 5, 8, 4).transpose(1, 2)
    k = attn.k_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    v = attn.v_proj(x).view(2, 5, 2, 4).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    expected = attn.o_proj(o.transpose(1, 2).reshape(2, 5, 32))
    ledger.check("MultiHeadAttention, GQA 8/2, causal", ledger.torch(SDPA + "(enable_gqa=True)"),
                 attn(x, mask=causal_mask(5)), expected, tol=ATOL)


@pytest.mark.equality
def test_mqa_single_kv_head_matches_torch_sdpa(ledger):
    """Multi-query attention: one key/value head shared by 4 query heads, here as
    cross-attention with a padding mask, against F.scaled_dot_product_attention."""
    attn = randomize_(MultiHeadAttention(16, 4, n_kv_heads=1)).eval()
    assert attn.n_rep == 4 and attn.v_proj.weight.shape == (4, 16)  # (H_kv * D, C)
    x, memory = torch.randn(2, 3, 16), torch.randn(2, 6, 16)
    keep = torch.ones(2, 1, 1, 6, dtype=torch.bool)  # (B, 1, 1, S)
    keep[1, ..., 4:] = False
    q = attn.q_proj(x).view(2, 3, 4, 4).transpose(1, 2)  # (B, H, T, D)
    k = attn.k_proj(memory).view(2, 6, 1, 4).transpose(1, 2)  # (B, 1, S, D)
    v = attn.v_proj(memory).view(2, 6, 1, 4).transpose(1, 2)  # (B, 1, S, D)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=True)  # (B, H, T, D)
    expected = attn.o_proj(o.transpose(1, 2).reshape(2, 3, 16))  # (B, T, C)
    ledger.check("MultiHeadAttention, MQA 4/1, cross-attention with padding",
                 ledger.torch(SDPA + "(enable_gqa=True)"), attn(x, memory, mask=keep), expected,
                 tol=ATOL)


def test_dropout_only_in_training():
    attn = randomize_(MultiHeadAttention(16, 2, dropout=0.5))
    x = torch.randn(1, 8, 16)
    attn.eval()
    assert torch.equal(attn(x), attn(x))
    attn.train()
    assert not torch.allclose(attn(x), attn(x))


def test_bad_head_counts_are_rejected():
    with pytest.raises(ValueError, match=r"d_model \(10\) must be divisible by n_heads \(3\)"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match=r"n_heads \(6\) must be divisible by n_kv_heads \(4\)"):
        MultiHeadAttention(12, 6, n_kv_heads=4)


@pytest.mark.parametrize("n_heads, message", [
    ("4", r"n_heads must be a positive integer, got '4' \(str\)"),
    (4.0, r"n_heads must be a positive integer, got 4.0 \(float\)"),
    (True, r"n_heads must be a positive integer, got True \(bool\)"),
    (0, r"n_heads must be positive, got 0"),
])
def test_head_counts_of_another_type_get_a_value_error_naming_them(n_heads, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(64, n_heads)
    with pytest.raises(ValueError, match=message.replace("n_heads", "n_kv_heads")):
        MultiHeadAttention(64, 4, n_kv_heads=n_heads)


@pytest.mark.parametrize("implementation", ATTN_IMPLEMENTATIONS)
def test_a_float_mask_with_causal_gets_our_value_error(implementation):
    """The mask is checked before it is combined with the causal one (where ``&`` on a float
    mask would raise PyTorch's NotImplementedError)."""
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="mask must be a boolean tensor .* got dtype torch.float32"):
        ATTENTION_FUNCTIONS[implementation](q, q, q, torch.ones(1, 1, 1, 4), causal=True)
    with pytest.raises(ValueError, match="boolean"):
        attention_mask(4, 4, torch.ones(4, 4), causal=True)


def test_mask_that_does_not_broadcast_is_rejected():
    q = torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(3, 4\) does not broadcast .*\(2, 4, 4\)"):
        scaled_dot_product_attention(q, q, q, mask=torch.ones(3, 4, dtype=torch.bool))


def test_non_boolean_mask_is_rejected():
    q = torch.randn(4, 8)
    with pytest.raises(ValueError, match="boolean"):
        scaled_dot_product_attention(q, q, q, mask=torch.ones(4, 4))


def test_wrong_input_width_is_rejected():
    with pytest.raises(ValueError, match=r"\(B, T, 16\), got \(1, 3, 8\)"):
        MultiHeadAttention(16, 2)(torch.randn(1, 3, 8))


def test_bad_causal_mask_sizes_are_rejected():
    with pytest.raises(ValueError, match="T=5, S=3"):
        causal_mask(5, 3)


@pytest.mark.equality
def test_fp64_attention_keeps_fp64_precision(ledger):
    q, k, v = (torch.randn(2, 6, 16, dtype=torch.float64) for _ in range(3))
    out, w = scaled_dot_product_attention(q, k, v, mask=causal_mask(6))
    scores = (q @ k.transpose(-1, -2) / 4.0).masked_fill(~causal_mask(6), float("-inf"))
    assert w.dtype == torch.float64
    ledger.check("causal attention weights", "softmax of the masked scores written out", w,
                 torch.softmax(scores, -1), tol=1e-14)
    ledger.check("causal attention output", "softmax of the masked scores written out", out,
                 torch.softmax(scores, -1) @ v, tol=1e-13)


@pytest.mark.equality
def test_half_precision_softmax_runs_in_fp32(ledger):
    q = (20 * torch.randn(1, 4, 8)).to(torch.bfloat16)
    out, w = scaled_dot_product_attention(q, q, q)
    assert w.dtype == out.dtype == torch.bfloat16
    ref = torch.softmax((q.float() @ q.float().transpose(-1, -2)) / 8 ** 0.5, -1)
    ledger.check("attention weights of bf16 inputs", "fp32 softmax written out", w, ref,
                 tol=2e-2)  # bf16 has ~3 significant digits


# ---- one dispatch table: every entry computes the same attention --------------------------

# (name, T, S, padding, causal): padding is None, "keys" (B, 1, 1, S), "blocked row"
# (B, 1, T, S) with one query that sees no key at all, or "left" (B, 1, 1, S) / "left per
# query" (B, 1, T, S): sequence 1 left-padded so that, with causal after a prefix of 2, its
# queries 0 and 1 see no key, though neither the mask nor causal alone blocks their rows.
CASES = [
    ("square causal", 7, 7, None, True),
    ("chunk after a cached prefix", 5, 12, None, True),
    ("one query", 1, 9, None, True),
    ("padding and causal", 6, 10, "keys", True),
    ("padding, not causal", 6, 10, "keys", False),
    ("a fully blocked query row", 4, 6, "blocked row", False),
    ("a blocked row and causal", 4, 6, "blocked row", True),
    ("padding and causal over 3 key tiles", 20, 150, "keys", True),  # tiled reads 64 at a time
    ("left padding and causal block rows together", 5, 7, "left", True),
    ("left padding per query and causal", 5, 7, "left per query", True),
]


def reference_attention(q, k, v, keep, scale):
    """softmax(scale · q kᵀ) v written out independently: heads repeated, blocked scores -inf,
    a row with no visible key all zeros. ``keep`` is the full (B, H, T, S) mask or None."""
    n_rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    scores = scale * q @ k.transpose(-2, -1)  # (B, H, T, S)
    if keep is None:
        keep = torch.ones_like(scores, dtype=torch.bool)
    # the lowest finite score, not -inf: exp(min - max) is 0 all the same, and a row with no
    # visible key stays finite (uniform) before it is zeroed, so its gradients are 0, not NaN
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1) * keep.any(dim=-1, keepdim=True)  # (B, H, T, S)
    return weights @ v, weights


def case_inputs(T, S, padding, causal, H=6, H_kv=3, D=8, Dv=8):
    """fp64 q, k, v, the mask to pass, and the full mask the reference applies."""
    B = 2
    q = torch.randn(B, H, T, D, dtype=torch.float64)
    k = torch.randn(B, H_kv, S, D, dtype=torch.float64)
    v = torch.randn(B, H_kv, S, Dv, dtype=torch.float64)
    mask = None
    if padding == "keys":
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
        mask[0, ..., :3] = False  # sequence 0: its first three positions are padding
    elif padding == "blocked row":
        mask = torch.rand(B, 1, T, S) > 0.3
        mask[..., 0] = True
        mask[1, 0, 2] = False  # query 2 of sequence 1 sees no key
    elif padding in ("left", "left per query"):
        mask = torch.ones(B, 1, 1, S, dtype=torch.bool)
        mask[1, ..., :S - T + 2] = False  # sequence 1: padding up to query 2's own position
        if padding == "left per query":
            mask = mask.expand(B, 1, T, S).clone()
    keep = torch.ones(B, H, T, S, dtype=torch.bool)
    if mask is not None:
        keep = keep & mask
    if causal:
        keep = keep & torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)  # bottom-right
    return q, k, v, mask, keep


@pytest.mark.parametrize("heads", [(6, 6), (6, 3), (6, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("name, T, S, padding, causal", CASES, ids=[c[0] for c in CASES])
@pytest.mark.equality
def test_every_entry_equals_the_reference(name, T, S, padding, causal, heads, ledger):
    q, k, v, mask, keep = case_inputs(T, S, padding, causal, H=heads[0], H_kv=heads[1])
    expected, expected_w = reference_attention(q, k, v, keep, 8 ** -0.5)
    for implementation, attend in ATTENTION_FUNCTIONS.items():
        out, weights = attend(q, k, v, mask, causal=causal, need_weights=True)
        assert out.shape == expected.shape, implementation
        ledger.check(f"{implementation} output", WRITTEN_OUT, out, expected, tol=1e-12)
        if implementation == "eager":
            ledger.check("eager weights", WRITTEN_OUT, weights, expected_w, tol=1e-12)
        else:
            assert weights is None  # these never form the weights
    blocked = ~keep.any(dim=-1)  # (B, H, T): queries that see no key
    assert blocked.any() == (padding in ("blocked row", "left", "left per query"))
    for attend in ATTENTION_FUNCTIONS.values():  # the rows with no key are 0, not NaN
        out, _ = attend(q, k, v, mask, causal=causal)
        assert torch.equal(out[blocked], torch.zeros_like(out[blocked]))


@pytest.mark.parametrize("shape", [(7,), (5, 1), (2, 1, 1, 7), (2, 1, 5, 7)],
                         ids=["keys", "queries", "key padding", "per query"])
@pytest.mark.parametrize("causal", [False, True])
def test_zero_rows_without_keys_reads_the_mask_and_causal_together(shape, causal):
    """The one rule, on every mask shape the entries accept: the rows zeroed are those with no
    True in ``mask`` AND (with causal) the bottom-right causal mask, formed here in full."""
    # seed 10: with causal, and for the two shapes with a row per query, some rows see keys
    # and some see none
    mask = torch.rand(shape, generator=torch.Generator().manual_seed(10)) > 0.6
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)  # (B, H, T, Dv)
    visible = mask & (causal_mask(5, 7) if causal else torch.ones(5, 7, dtype=torch.bool))
    expected = x * visible.any(dim=-1, keepdim=True)  # (..., T, 1) broadcast over Dv
    assert torch.equal(zero_rows_without_keys(x, mask, 7, causal=causal), expected)
    assert torch.equal(zero_rows_without_keys(x, None, 7, causal=causal), x)


def sdpa_before_2_5(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """``F.scaled_dot_product_attention`` as PyTorch 2.1-2.4 computes it on its math path: a
    plain softmax, so a query whose scores are all -inf gets NaN (2.5 brought a softmax that
    gives 0 there, pytorch#133882, so today's kernels cannot show the difference)."""
    if enable_gqa:
        n = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(n, -3), v.repeat_interleave(n, -3)
    s = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if is_causal:
        attn_mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return F.dropout(torch.softmax(s, -1), dropout_p) @ v


BLOCKED_ROWS = [c for c in CASES if c[3] in ("blocked row", "left", "left per query")]


@pytest.mark.parametrize("name, T, S, padding, causal", BLOCKED_ROWS,
                         ids=[c[0] for c in BLOCKED_ROWS])
def test_rows_without_keys_are_zero_whatever_the_sdpa_kernel_gives(name, T, S, padding, causal,
                                                                   monkeypatch):
    """A query that sees no key, by the mask alone or by the mask AND causal (chapter 7's
    left-padded batch), gets 0 on every path, also where SDPA itself gives NaN there."""
    q, k, v, mask, keep = case_inputs(T, S, padding, causal)
    expected, _ = reference_attention(q, k, v, keep, 8 ** -0.5)
    blocked = ~keep.any(dim=-1)  # (B, H, T)
    nan = sdpa_before_2_5(q, k, v, attn_mask=keep, enable_gqa=True)
    assert nan[blocked].isnan().all()  # the stand-in does give NaN on those rows
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", sdpa_before_2_5)
    for implementation, attend in ATTENTION_FUNCTIONS.items():
        out, _ = attend(q, k, v, mask, causal=causal)
        assert not out.isnan().any(), implementation
        assert (out - expected).abs().max().item() <= 1e-12, implementation


@pytest.mark.parametrize("implementation", ATTN_IMPLEMENTATIONS)
@pytest.mark.parametrize("padding", ["left", "left per query"])
def test_rows_without_keys_have_the_references_gradients(implementation, padding):
    q, k, v, mask, keep = case_inputs(5, 7, padding, True)
    inputs = [x.requires_grad_() for x in (q, k, v)]
    weight = torch.randn(2, 6, 5, 8, dtype=torch.float64)  # a loss that reads every output
    expected = torch.autograd.grad((reference_attention(q, k, v, keep, 8 ** -0.5)[0]
                                    * weight).sum(), inputs)
    out, _ = ATTENTION_FUNCTIONS[implementation](q, k, v, mask, causal=True)
    got = torch.autograd.grad((out * weight).sum(), inputs)
    for name, g, e in zip("qkv", got, expected):
        assert torch.isfinite(g).all(), name
        assert (g - e).abs().max().item() <= 1e-12, name
    assert (got[0][~keep.any(dim=-1)] == 0).all()  # a query that sees no key gets no gradient


def test_batched_prefill_with_left_padding_has_no_nan_on_sdpa_before_2_5(monkeypatch):
    """Chapter 7's batched prefill: left padding and causal through the model, on sdpa with
    the NaN of PyTorch < 2.5; the padded rows are 0, so no NaN reaches the real tokens."""
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", sdpa_before_2_5)
    model = Decoder(DecoderConfig(attn_implementation="sdpa")).double().eval()
    tokens = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    real = torch.tensor([[False, False, True, True, True], [True] * 5])
    cache, x = model.new_cache(2), model.embed_tokens(tokens)
    with torch.no_grad():
        for block in model.layers:
            x = block(x, (model.rope_cos[:5], model.rope_sin[:5]), cache,
                      mask=real[:, None, None, :])
        logits = model.lm_head(model.norm(x))  # (B, T, V)
    assert not logits.isnan().any()
    alone = model(tokens[:1, 2:])  # the real tokens of sequence 0 alone, no padding
    assert (logits[0, 2:] - alone[0]).abs().max().item() <= 1e-10


@pytest.mark.parametrize("implementation", ATTN_IMPLEMENTATIONS)
@pytest.mark.equality
def test_values_of_another_width_and_a_custom_scale(implementation, ledger):
    q, k, v, mask, keep = case_inputs(5, 11, "keys", True, H=4, H_kv=2, D=8, Dv=5)
    expected, _ = reference_attention(q, k, v, keep, 0.3)
    out, _ = ATTENTION_FUNCTIONS[implementation](q, k, v, mask, causal=True, scale=0.3)
    assert out.shape == (2, 4, 5, 5)
    ledger.check("output, Dv = 5, scale 0.3", WRITTEN_OUT, out, expected, tol=1e-12)
    default, _ = ATTENTION_FUNCTIONS[implementation](q, k, v, mask, causal=True)
    assert (default - out).abs().max().item() > 1e-3  # the scale is used, not D ** -0.5


@pytest.mark.equality
def test_the_public_reference_takes_a_scale(ledger):
    q, k, v = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.randn(2, 7, 8)
    _, w = scaled_dot_product_attention(q, k, v, None, 0.0, 0.5)
    ledger.check("attention weights, scale 0.5", "softmax(0.5 q kᵀ) written out", w,
                 torch.softmax(0.5 * q @ k.transpose(-1, -2), dim=-1), tol=1e-6)


def test_the_causal_mask_is_decided_in_one_place():
    """attention_mask: nothing for a single query or without causal, the bottom-right mask
    otherwise, AND-ed with a padding mask."""
    padding = torch.tensor([False, True, True, True, True])[None, None, None]  # (1, 1, 1, S)
    assert attention_mask(1, 5, causal=True) is None  # a decoding step: no mask at all
    assert attention_mask(1, 5, padding, causal=True) is padding
    assert attention_mask(3, 5, padding, causal=False) is padding
    assert torch.equal(attention_mask(3, 5, causal=True), causal_mask(3, 5))
    assert torch.equal(attention_mask(3, 5, padding, causal=True), padding & causal_mask(3, 5))


def test_a_decoding_step_builds_no_mask(monkeypatch):
    """With a cache, one new token: no implementation builds a mask (nor the model)."""
    built = []
    real = attention.causal_mask

    def counting(*args, **kwargs):
        built.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "causal_mask", counting)
    for implementation in ATTN_IMPLEMENTATIONS:
        model = Decoder(DecoderConfig(attn_implementation=implementation)).eval()
        cache = model.new_cache(1)
        model(torch.randint(0, 64, (1, 6)), cache)  # a prefill: eager builds its (6, 6) mask
        prefill = len(built)
        model(torch.randint(0, 64, (1, 1)), cache)
        assert len(built) == prefill, implementation
        built.clear()


@pytest.mark.parametrize("implementation", ATTN_IMPLEMENTATIONS)
def test_mha_dispatches_through_the_table(implementation, monkeypatch):
    calls = []
    entry = ATTENTION_FUNCTIONS[implementation]

    def spy(*args, **kwargs):
        calls.append(kwargs["causal"])
        return entry(*args, **kwargs)

    monkeypatch.setitem(ATTENTION_FUNCTIONS, implementation, spy)
    attn = MultiHeadAttention(16, 4, n_kv_heads=2, attn_implementation=implementation)
    attn(torch.randn(1, 3, 16), causal=True)
    assert calls == [True]


def test_bad_entry_inputs_are_rejected():
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 3, 5, 8), torch.randn(1, 3, 5, 8)
    for attend in ATTENTION_FUNCTIONS.values():
        with pytest.raises(ValueError, match=r"query heads \(4\) must be a multiple of "
                                             r"key/value heads \(3\)"):
            attend(q, k, v)
        with pytest.raises(ValueError, match=r"4 dimensions .* got q \(4, 3, 8\)"):
            attend(q[0], k, v)
        with pytest.raises(ValueError, match="same positive head dim, got 8 and 4"):
            attend(q[:, :3], k[..., :4], v)
        with pytest.raises(ValueError, match="same number of heads, got 3 and 2"):
            attend(q[:, :3], k, v[:, :2])
