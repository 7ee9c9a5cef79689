"""Tiled attention with an online softmax, against torch.nn.functional.scaled_dot_product_attention.

Tolerances: fp32 1e-5 and fp64 1e-12 (only the order of the sums differs); bf16 as stated in
its test.
"""
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.flash import flash_attention

TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
SDPA = "F.scaled_dot_product_attention"


def qkv(lead, T, S, D=8, Dv=None, dtype=torch.float64, scale=1.0):
    Dv = D if Dv is None else Dv
    q = scale * torch.randn(*lead, T, D, dtype=dtype)
    k = scale * torch.randn(*lead, S, D, dtype=dtype)
    v = torch.randn(*lead, S, Dv, dtype=dtype)
    return q, k, v


def bottom_right(T, S):
    """Query i sees keys 0 … S - T + i, written as a shifted lower triangle (True = attend)."""
    return torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)


class Recorder(TorchDispatchMode):
    """Records (operator, shape) of every tensor that every operation produces."""

    def __init__(self):
        super().__init__()
        self.made = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.made += [(func, tuple(t.shape)) for t in tree_leaves(out)
                      if isinstance(t, torch.Tensor)]
        return out


# ---- equal to PyTorch's fused attention --------------------------------------------------

SHAPES = [  # lead, T, S, D, Dv, block_size
    ((2, 3), 1, 1, 8, 8, 64),  # one query, one key
    ((2, 3), 1, 100, 8, 8, 64),  # one query (a decoding step), S not a multiple of the block
    ((2, 3), 37, 37, 8, 8, 7),  # T = S
    ((2, 3), 20, 100, 8, 8, 16),  # T < S
    ((2,), 30, 130, 16, 8, 1),  # block of one key; Dv != D; 3-D inputs
    ((2, 3), 30, 50, 8, 12, 64),  # block larger than S; Dv > D
    ((), 9, 20, 4, 4, 3),  # 2-D inputs
]


@pytest.mark.equality
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("lead, T, S, D, Dv, block", SHAPES)
def test_equals_sdpa_without_mask(lead, T, S, D, Dv, block, dtype, ledger):
    q, k, v = qkv(lead, T, S, D, Dv, dtype)
    out = flash_attention(q, k, v, block_size=block)
    assert out.shape == (*lead, T, Dv) and out.dtype == dtype
    ledger.check("tiled attention, no mask", ledger.torch(SDPA),
                 out, F.scaled_dot_product_attention(q, k, v), tol=TOL[dtype])


@pytest.mark.equality
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T, block", [(1, 4), (37, 7), (64, 64), (100, 16), (50, 128)])
def test_causal_square_equals_sdpa_is_causal(T, block, dtype, ledger):
    q, k, v = qkv((2, 3), T, T, dtype=dtype)
    out = flash_attention(q, k, v, causal=True, block_size=block)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ledger.check("tiled attention, causal, T = S", ledger.torch(SDPA + "(is_causal=True)"),
                 out, expected, tol=TOL[dtype])


@pytest.mark.equality
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T, S, block", [(1, 9, 4), (3, 10, 4), (20, 100, 16), (70, 130, 7),
                                         (64, 200, 64), (5, 300, 512)])
def test_causal_after_a_prefix_is_bottom_right(T, S, block, dtype, ledger):
    """Queries at the end of the keys: compared with an explicit bottom-right mask, not with
    is_causal, which aligns the triangle to the top left."""
    q, k, v = qkv((2, 3), T, S, dtype=dtype)
    out = flash_attention(q, k, v, causal=True, block_size=block)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right(T, S))
    ledger.check("tiled attention, causal after a prefix",
                 ledger.torch(SDPA + " with a bottom-right mask"), out, expected, tol=TOL[dtype])
    if 1 < T < S:  # the top-left triangle is another answer, so the comparison can fail
        top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        assert (out - top_left).abs().max().item() > 1e-2


@pytest.mark.equality
def test_rows_whose_later_blocks_are_all_masked(ledger):
    """Causal, small blocks: for the first rows every block after their own is masked out
    entirely (those rows are finished early and set aside); each row still equals the
    reference, the first one exactly v_0."""
    q, k, v = qkv((2, 3), 130, 130, dtype=torch.float64)
    out = flash_attention(q, k, v, causal=True, block_size=8)
    expected = scaled_dot_product_attention(q, k, v, mask=bottom_right(130, 130))[0]
    ledger.check("tiled attention, rows finished early", "transformer_lib's written-out attention",
                 out, expected, tol=1e-12)
    assert torch.equal(out[..., 0, :], v[..., 0, :])  # query 0 sees key 0 only


@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-3), (torch.float64, 1e-10)])
def test_large_logits_do_not_overflow(dtype, tol, ledger):
    """Inputs scaled by 50: scores of size ~10^3-10^4, and e^s overflows (e^710 = inf even in
    fp64) unless the running max is subtracted. A score s is only known to |s| · eps (fp32:
    ~10^-4 here, fp64: ~10^-12), and e^s turns that into a relative error of the same size in
    the weights: hence the tolerances."""
    q, k, v = qkv((2, 3), 40, 90, dtype=dtype, scale=50.0)
    assert (q[..., :1, :] @ k.transpose(-2, -1)).abs().max() > 1000
    for causal in (False, True):
        out = flash_attention(q, k, v, causal=causal, block_size=16)
        mask = bottom_right(40, 90) if causal else None
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.isfinite(out).all()
        ledger.check(f"tiled attention, scores ~10^3, causal={causal}", ledger.torch(SDPA),
                     out, expected, tol=tol)


@pytest.mark.equality
def test_bf16_is_accumulated_in_fp32(ledger):
    """bf16 keeps 8 significant bits. Accumulated in fp32 and rounded once, the output is the
    fp32 result (on the same bf16 inputs) to within one bf16 step, 2^-7 relative; the log-sum-exp
    stays fp32 and matches to fp32 precision."""
    q, k, v = qkv((2, 3), 50, 120, dtype=torch.bfloat16)
    out, lse = flash_attention(q, k, v, causal=True, block_size=16, return_lse=True)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    qf, kf, vf = q.float(), k.float(), v.float()
    expected = F.scaled_dot_product_attention(qf, kf, vf, attn_mask=bottom_right(50, 120))
    assert ((out.float() - expected).abs() <= 2 ** -7 * expected.abs() + 1e-6).all()
    scores = (qf @ kf.transpose(-2, -1) / 8 ** 0.5).masked_fill(~bottom_right(50, 120), -torch.inf)
    ledger.check("log-sum-exp of bf16 inputs", ledger.torch("logsumexp") + " in fp32", lse,
                 scores.logsumexp(dim=-1), tol=1e-5)


@pytest.mark.equality
def test_log_sum_exp_merges_two_halves_of_the_keys(ledger):
    """The second output: exp(s_j - lse) are the softmax weights, so two halves of the keys,
    attended separately, merge into the whole exactly."""
    q, k, v = qkv((2, 3), 12, 40, dtype=torch.float64)
    out, lse = flash_attention(q, k, v, block_size=8, return_lse=True)
    scores = q @ k.transpose(-2, -1) / 8 ** 0.5  # (2, 3, 12, 40)
    ledger.check("log-sum-exp", ledger.torch("logsumexp"), lse, scores.logsumexp(dim=-1),
                 tol=1e-12)
    out_a, lse_a = flash_attention(q, k[..., :25, :], v[..., :25, :], return_lse=True)
    out_b, lse_b = flash_attention(q, k[..., 25:, :], v[..., 25:, :], return_lse=True)
    w_a = torch.sigmoid(lse_a - lse_b)[..., None]  # e^lse_a / (e^lse_a + e^lse_b): (2, 3, 12, 1)
    merged = w_a * out_a + (1 - w_a) * out_b
    ledger.check("two halves of the keys merged by their log-sum-exp", "one tiled pass", merged,
                 out, tol=1e-12)


# ---- the backward pass: recomputed tiles, exact gradients ---------------------------------

def written_out(q, k, v, mask=None, scale=None):
    """Softmax attention formed in full (the reference): (out, lse)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale  # (..., T, S)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = scores.logsumexp(dim=-1)  # (..., T)
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)  # no-key rows: 0
    return weights @ v, lse


def grads_of(attend, q, k, v, *, with_lse=False):
    """Gradients of a fixed random linear function of the output (and of the lse)."""
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out, lse = attend(*inputs)
    g = torch.Generator().manual_seed(7)
    loss = (out * torch.randn(out.shape, generator=g, dtype=out.dtype)).sum()
    if with_lse:
        finite = torch.isfinite(lse)
        loss = loss + (lse.where(finite, 0.0) * torch.randn(lse.shape, generator=g,
                                                             dtype=lse.dtype)).sum()
    loss.backward()
    return [x.grad for x in inputs]


GRAD_CASES = [  # lead, T, S, D, Dv, causal, block, scale
    ((2, 2), 24, 24, 8, 8, False, 7, None),  # square, S not a multiple of the block
    ((2, 2), 24, 40, 8, 6, False, 64, None),  # T != S, Dv != D, one tile
    ((2, 2), 24, 24, 8, 8, True, 5, None),  # causal square
    ((2, 1), 9, 50, 8, 12, True, 4, None),  # causal after a prefix, small tiles
    ((3,), 1, 33, 16, 16, True, 8, None),  # one query (decoding)
    ((2, 2), 17, 30, 8, 8, True, 8, 0.37),  # a custom scale
]


@pytest.mark.equality
@pytest.mark.parametrize("lead, T, S, D, Dv, causal, block, scale", GRAD_CASES)
def test_gradients_equal_the_fp64_reference_and_sdpa(lead, T, S, D, Dv, causal, block, scale, ledger):
    """fp64: gradients of q, k, v equal the written-out reference's and PyTorch's SDPA's to
    1e-12 (the order of the sums differs, nothing else)."""
    q, k, v = qkv(lead, T, S, D, Dv)
    mask = bottom_right(T, S) if causal else None
    ours = grads_of(lambda a, b, c: flash_attention(a, b, c, causal=causal, scale=scale,
                                                    block_size=block, return_lse=True),
                    q, k, v)
    reference = grads_of(lambda a, b, c: written_out(a, b, c, mask, scale), q, k, v)
    sdpa = grads_of(lambda a, b, c: (F.scaled_dot_product_attention(
        a, b, c, attn_mask=mask, scale=scale), None), q, k, v)
    for name, got, want, theirs in zip("qkv", ours, reference, sdpa):
        ledger.check(f"gradient of {name}", "autograd through attention written out", got, want,
                     tol=1e-12)
        ledger.check(f"gradient of {name}, SDPA", ledger.torch(SDPA) + " autograd", got, theirs,
                     tol=1e-12)
    assert ours[0].abs().max() > 1e-3  # the comparison is not between zeros


@pytest.mark.equality
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ["keys", "rows"], ids=["(B, 1, 1, S)", "(B, 1, T, S)"])
def test_gradients_with_a_mask_and_of_the_log_sum_exp(causal, shape, ledger):
    """A padding or per-query mask, a row that sees no key (zero gradient, no NaN), and a
    gradient flowing into the returned log-sum-exp as well: fp64, 1e-12."""
    T, S = 12, 30
    q, k, v = qkv((2, 3), T, S)
    if shape == "keys":
        mask = torch.ones(2, 1, 1, S, dtype=torch.bool)
        mask[0, ..., :11] = False  # sequence 0: the first 11 keys are padding
    else:
        mask = torch.rand(2, 1, T, S, generator=torch.Generator().manual_seed(1)) > 0.4
        mask[..., 0] = True
        mask[1, :, 4] = False  # one query that sees no key at all
    full = mask & bottom_right(T, S) if causal else mask
    ours = grads_of(lambda a, b, c: flash_attention(a, b, c, mask=mask, causal=causal,
                                                    block_size=7, return_lse=True),
                    q, k, v, with_lse=True)
    reference = grads_of(lambda a, b, c: written_out(a, b, c, full), q, k, v, with_lse=True)
    for name, got, want in zip("qkv", ours, reference):
        assert torch.isfinite(got).all()
        ledger.check(f"gradient of {name}, with the log-sum-exp's",
                     "autograd through attention written out", got, want, tol=1e-12)


@pytest.mark.equality
def test_gradients_with_grouped_query_heads(ledger):
    """The "tiled" attention entry repeats the key/value heads before the tiled loop; its
    gradients reach the shared heads as SDPA's with enable_gqa do (fp64, 1e-12)."""
    from transformer_lib.attention import tiled_attention

    q = torch.randn(2, 6, 20, 8, dtype=torch.float64)
    k, v = torch.randn(2, 2, 20, 8, dtype=torch.float64), torch.randn(2, 2, 20, 8,
                                                                     dtype=torch.float64)
    ours = grads_of(lambda a, b, c: (tiled_attention(a, b, c, causal=True)[0], None), q, k, v)
    sdpa = grads_of(lambda a, b, c: (F.scaled_dot_product_attention(
        a, b, c, is_causal=True, enable_gqa=True), None), q, k, v)
    for name, got, want in zip("qkv", ours, sdpa):
        assert got.shape == want.shape
        ledger.check(f"gradient of {name}, 6 query / 2 kv heads",
                     ledger.torch(SDPA + "(enable_gqa=True)") + " autograd", got, want, tol=1e-12)


def test_bf16_gradients_follow_fp32():
    """bf16 inputs: the backward pass accumulates in fp32 and rounds once per gradient."""
    q, k, v = qkv((2, 2), 20, 30, dtype=torch.float32)
    ours = grads_of(lambda a, b, c: (flash_attention(a, b, c, causal=True, block_size=8), None),
                    q.bfloat16(), k.bfloat16(), v.bfloat16())
    want = grads_of(lambda a, b, c: (flash_attention(a, b, c, causal=True, block_size=8), None),
                    q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float())
    for got, ref in zip(ours, want):
        assert got.dtype == torch.bfloat16
        assert ((got.float() - ref).abs() <= 2 ** -7 * ref.abs() + 1e-2).all()


@pytest.mark.parametrize("causal", [False, True])
def test_dropout_gradients_replay_the_same_masks(causal):
    """With dropout, backward draws the masks again from the forward pass's generator state.
    gradcheck compares it with finite differences of the same function (the seed is reset
    before every call, so every call drops the same weights); the global generator is left
    where the forward pass left it."""
    q, k, v = qkv((1, 2), 6, 11, D=4)
    mask = torch.ones(6, 11, dtype=torch.bool)
    mask[2, :5] = False

    def attend(a, b, c):
        torch.manual_seed(11)
        return flash_attention(a, b, c, mask=mask, causal=causal, dropout_p=0.4, block_size=3)

    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    assert torch.autograd.gradcheck(attend, inputs, eps=1e-6, atol=1e-8)
    out = attend(*inputs)
    state = torch.get_rng_state()
    out.sum().backward()
    assert torch.equal(torch.get_rng_state(), state)
    assert (out - flash_attention(q, k, v, mask=mask, causal=causal)).abs().max() > 1e-2


def saved_bytes(fn):
    """Bytes of the distinct storages autograd saves for the backward pass while fn() runs,
    and the shapes saved."""
    storages, shapes = {}, []

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values()), shapes


def test_the_backward_pass_saves_o_of_t_bytes():
    """What autograd keeps for the backward pass: q, k, v, the output and the log-sum-exp,
    no tile: doubling T = S doubles the bytes, and they stay far below one (T, S) float32
    matrix, which the written-out attention does save (so the measurement can fail)."""
    found = {}
    for T in (1024, 2048):
        q, k, v = (torch.randn(1, 1, T, 16, requires_grad=True) for _ in range(3))
        found[T], shapes = saved_bytes(
            lambda q=q, k=k, v=v: flash_attention(q, k, v, causal=True, block_size=32))
        assert sorted(shapes) == sorted([(1, 1, T, 16)] * 4 + [(1, 1, T)])
        assert found[T] == 4 * (4 * T * 16 + T)  # q, k, v, out (float32) and lse
        naive, _ = saved_bytes(lambda q=q, k=k, v=v, T=T: written_out(q, k, v,
                                                                      bottom_right(T, T)))
        assert naive >= 4 * T * T > 10 * found[T]
    assert found[2048] == 2 * found[1024]


def test_without_recompute_autograd_differentiates_the_loop_and_keeps_every_tile():
    """``recompute=False``: the same gradients, but autograd records the loop, so what it
    keeps grows like T · S (more than one (T, S) matrix), not like T."""
    q, k, v = qkv((2,), 20, 50, Dv=6)
    for causal in (False, True):
        def attend(*x, recompute, causal=causal):
            return flash_attention(*x, causal=causal, block_size=16, return_lse=True,
                                   recompute=recompute)
        ours = grads_of(lambda *x: attend(*x, recompute=False), q, k, v, with_lse=True)
        theirs = grads_of(lambda *x: attend(*x, recompute=True), q, k, v, with_lse=True)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)
    T = 512
    q, k, v = (torch.randn(1, 1, T, 16, requires_grad=True) for _ in range(3))
    kept, _ = saved_bytes(lambda: flash_attention(q, k, v, block_size=32, recompute=False))
    assert kept >= 4 * T * T


class LiveBytes(TorchDispatchMode):
    """The peak, over a call, of the bytes held by the tensors its operations created and
    that were still alive (storages counted once, views included), the inputs left out."""

    def __init__(self, inputs=()):
        super().__init__()
        self.outside = {t.untyped_storage().data_ptr() for t in inputs}
        self.size, self.refs, self.now, self.peak = {}, {}, 0, 0

    def _release(self, key):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.now -= self.size.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            key = t.untyped_storage().data_ptr()
            if key in self.outside or key == 0:
                continue
            if key not in self.size:
                self.size[key], self.refs[key] = t.untyped_storage().nbytes(), 0
                self.now += self.size[key]
                self.peak = max(self.peak, self.now)
            self.refs[key] += 1
            weakref.finalize(t, self._release, key)
        return out


def test_what_is_alive_at_once_grows_like_t_causal_or_not():
    """Not the largest tensor but every tensor alive at the worst moment: with or without
    causal, doubling T = S at most doubles it (plus a tile), it stays within a few (T, block)
    and (T, Dv) tensors, and at T = S = 1024 it is under a tenth of the written-out
    attention's, which holds (T, S) matrices (so the measurement can fail)."""
    block, D = 32, 16
    peaks = {}
    for T in (512, 1024):
        q, k, v = (torch.randn(1, 1, T, D) for _ in range(3))
        for causal in (False, True):
            with LiveBytes((q, k, v)) as live:
                flash_attention(q, k, v, causal=causal, block_size=block)
            peaks[T, causal] = live.peak
            assert live.peak <= 4 * T * (4 * block + 6 * D + 8)  # float32 bytes
        with LiveBytes((q, k, v)) as naive:
            written_out(q, k, v, bottom_right(T, T))
        assert naive.peak >= 4 * T * T
    for causal in (False, True):
        assert peaks[1024, causal] <= naive.peak / 10  # at T = S = 1024
        assert peaks[1024, causal] <= 2.2 * peaks[512, causal]


# ---- memory: the (T, S) matrix never exists ----------------------------------------------

def test_the_score_matrix_is_never_formed():
    """Every tensor any operation produces, recorded at the dispatcher: none is as large as
    the (T, S) scores; the reference implementation does form them (so the check can fail)."""
    T, S, block = 96, 160, 16  # T · S = 15,360 elements per head; a tile is T · 16 = 1,536
    q, k, v = qkv((2,), T, S, D=8, Dv=8, dtype=torch.float32)
    for causal in (False, True):
        with Recorder() as ours:
            flash_attention(q, k, v, causal=causal, block_size=block)
        largest = max(torch.Size(shape).numel() for _, shape in ours.made)
        assert largest == 2 * T * block  # one tile of scores (the output is T · 8)
        assert not any(shape[-2:] == (T, S) for _, shape in ours.made)
    with Recorder() as naive:
        scaled_dot_product_attention(q, k, v)
    assert any(shape[-2:] == (T, S) for _, shape in naive.made)


def test_causal_skips_the_future_tiles():
    """With causal=True, rows that can see nothing of a tile are not computed: the score tiles
    hold about half as many entries as without (Σ over tiles of (T - start) · block)."""
    T = S = 160
    block = 16
    q, k, v = qkv((2,), T, S, D=8, Dv=5, dtype=torch.float32)
    counts = {}
    for causal in (False, True):
        with Recorder() as rec:
            flash_attention(q, k, v, causal=causal, block_size=block)
        counts[causal] = sum(torch.Size(shape).numel() for func, shape in rec.made
                             if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default)
                             and shape[-1] == block)
    assert counts[False] == 2 * T * S
    assert counts[True] == 2 * block * sum(T - start for start in range(0, S, block))  # 0.55x


# ---- bad input ----------------------------------------------------------------------------

def test_bad_inputs_are_rejected():
    q, k, v = qkv((2, 3), 4, 6)
    cases = [
        ((q, k[:1], v[:1]), {}, r"same leading dims, got \(2, 3\), \(1, 3\) and \(1, 3\)"),
        ((q, k[..., :4], v), {}, "same positive head dim, got 8 and 4"),
        ((q, k, v[..., :5, :]), {}, "same number of positions, got 6 and 5"),
        ((q, k, v), {"block_size": 0}, "block_size must be >= 1, got 0"),
        ((q, k[..., :3, :], v[..., :3, :]), {"causal": True},
         r"needs S >= T .* got T=4, S=3"),
        ((q[..., :0, :], k, v), {}, "T >= 1 queries and S >= 1 keys, got T=0, S=6"),
        ((q, k[..., :0, :], v[..., :0, :]), {}, "got T=4, S=0"),
        ((q.long(), k, v), {}, "q must be a floating-point tensor, got dtype torch.int64"),
        ((q, k, v.float()), {}, "one dtype, got torch.float64, torch.float64, torch.float32"),
        ((q[0, 0, 0], k, v), {}, r"q must have shape \(..., positions, dim\), got \(8,\)"),
        ((q, k, v), {"mask": torch.ones(4, 6)}, "mask must be a boolean tensor"),
        ((q, k, v), {"mask": torch.ones(3, 6, dtype=torch.bool)},
         r"mask of shape \(3, 6\) does not broadcast to scores of shape \(2, 3, 4, 6\)"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            flash_attention(*args, **kwargs)


# ---- a padding mask, a scale and dropout: what the "tiled" entry needs ------------------

@pytest.mark.equality
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ["keys", "rows"], ids=["(B, 1, 1, S)", "(B, 1, T, S)"])
def test_mask_is_read_tile_by_tile(causal, shape, ledger):
    """A boolean mask, per key or per (query, key), combined with causal: equal to SDPA with
    the same mask, whatever the tile size (fp64, 1e-12)."""
    q, k, v = qkv((2, 3), 20, 50)
    if shape == "keys":
        mask = torch.ones(2, 1, 1, 50, dtype=torch.bool)
        mask[0, ..., :13] = False  # sequence 0: the first 13 keys are padding
    else:
        mask = torch.rand(2, 1, 20, 50) > 0.4
        mask[..., 0] = True  # every query keeps key 0
    full = mask & bottom_right(20, 50) if causal else mask
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    for block in (1, 7, 64):
        out = flash_attention(q, k, v, mask=mask, causal=causal, block_size=block)
        ledger.check(f"tiled attention with a mask, tiles of {block}", ledger.torch(SDPA), out,
                     expected, tol=1e-12)


@pytest.mark.equality
def test_a_query_that_sees_no_key_gets_zeros_and_lse_minus_inf(ledger):
    """Rows whose keys are all blocked, including one whose first visible key comes after
    several blocked tiles (its running max must not be spoilt on the way)."""
    q, k, v = qkv((2,), 6, 40, scale=20.0)  # large scores: a wrong shift would show
    mask = torch.ones(6, 40, dtype=torch.bool)
    mask[1] = False  # query 1 sees nothing
    mask[3, :30] = False  # query 3 sees only keys 30 … 39, in the last tiles
    out, lse = flash_attention(q, k, v, mask=mask, block_size=8, return_lse=True)
    assert torch.equal(out[:, 1], torch.zeros_like(out[:, 1]))
    assert torch.isinf(lse[:, 1]).all() and (lse[:, 1] < 0).all()
    rows = [0, 2, 3, 4, 5]
    expected = F.scaled_dot_product_attention(q[:, rows], k, v, attn_mask=mask[rows])
    ledger.check("rows that see a key, scores ~400", ledger.torch(SDPA), out[:, rows], expected,
                 tol=1e-10)


@pytest.mark.equality
def test_custom_scale(ledger):
    q, k, v = qkv((2, 3), 9, 30)
    out = flash_attention(q, k, v, causal=True, scale=0.1, block_size=8)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bottom_right(9, 30), scale=0.1)
    ledger.check("tiled attention, scale 0.1", ledger.torch(SDPA), out, expected, tol=1e-12)


@pytest.mark.equality
def test_dropout_drops_weights_not_the_normaliser(ledger):
    """One tile (block_size >= S) draws the same dropout mask as the written-out reference
    from the same seed, so the two agree: dropout(softmax(s)) @ v."""
    q, k, v = qkv((2, 3), 10, 30)
    torch.manual_seed(5)
    out = flash_attention(q, k, v, dropout_p=0.3, block_size=64)
    torch.manual_seed(5)
    expected, _ = scaled_dot_product_attention(q, k, v, dropout_p=0.3)
    ledger.check("tiled attention, dropout 0.3, same seed",
                 "transformer_lib's written-out attention", out, expected, tol=1e-12)
    assert (out - flash_attention(q, k, v)).abs().max().item() > 1e-2  # dropout did act
