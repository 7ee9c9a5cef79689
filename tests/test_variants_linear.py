"""Linear attention, DeltaNet and Gated DeltaNet: each fast form equals its slow form, and the
slow forms equal formulations written differently (explicit matrices, autograd, cumsum)."""
import pytest
import torch
import torch.nn.functional as F

from transformer_lib.variants.linear import (
    delta_rule_chunked,
    delta_rule_recurrent,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    linear_attention,
    linear_attention_recurrent,
)

# Tolerances: fp32 ≈ 1e-5 (a few ulps of O(1) values over tens of steps); fp64 1e-12, for
# chunked vs recurrent too (a triangular solve against a loop; measured errors are ~1e-15).
DTYPES = [(torch.float32, 1e-5), (torch.float64, 1e-12)]
CHUNKED_DTYPES = [(torch.float32, 1e-5), (torch.float64, 1e-12)]
B, H, T, DK, DV = 2, 3, 50, 8, 6  # Dv != Dk, so a transposed state cannot pass


def inputs(dtype=torch.float64, T=T, unit_keys=False):
    """Random q, k, v, alpha in (0.8, 1), beta in (0.01, 0.99), and a random state."""
    q, k = torch.randn(B, H, T, DK, dtype=dtype), torch.randn(B, H, T, DK, dtype=dtype)
    if unit_keys:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    v = torch.randn(B, H, T, DV, dtype=dtype)
    alpha = 0.8 + 0.2 * torch.rand(B, H, T, dtype=dtype)
    beta = 0.01 + 0.98 * torch.rand(B, H, T, dtype=dtype)
    state = torch.randn(B, H, DV, DK, dtype=dtype)
    return q, k, v, alpha, beta, state


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


# ---- independent formulations --------------------------------------------------------------

NAIVE = "explicit Dk × Dk matrices, one head at a time in fp64"
REGRESSION = "online regression S ← S − β ∇S, the gradient by autograd"

def naive_delta(q, k, v, beta, alpha=None, state=None):
    """One head at a time in fp64, with the explicit Dk × Dk matrix α (I − β k kᵀ)."""
    q, k, v, beta = q.double(), k.double(), v.double(), beta.double()
    out = torch.zeros(*v.shape, dtype=torch.float64)
    states = torch.zeros(B, H, DV, DK, dtype=torch.float64)
    eye = torch.eye(DK, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = torch.zeros(DV, DK, dtype=torch.float64) if state is None else state[b, h].double()
            for t in range(q.shape[2]):
                col = k[b, h, t].reshape(DK, 1)
                a = 1.0 if alpha is None else alpha[b, h, t].double()
                factor = a * (eye - beta[b, h, t] * (col @ col.T))
                S = S @ factor + beta[b, h, t] * v[b, h, t].reshape(DV, 1) @ col.T
                out[b, h, t] = S @ q[b, h, t]
            states[b, h] = S
    return out, states


def regression_delta(q, k, v, beta):
    """The delta rule as online regression: S ← S − β ∇_S ½‖S k − v‖², the gradient by autograd."""
    S = torch.zeros(B, H, DV, DK, dtype=q.dtype)
    outs = []
    for t in range(q.shape[2]):
        S = S.detach().requires_grad_(True)
        recalled = (S @ k[:, :, t, :, None]).squeeze(-1)  # (B, H, Dv)
        loss = 0.5 * (recalled - v[:, :, t]).pow(2).sum()  # heads are independent: sum is fine
        (grad,) = torch.autograd.grad(loss, S)
        S = S.detach() - beta[:, :, t, None, None] * grad
        outs.append((S @ q[:, :, t, :, None]).squeeze(-1))
    return torch.stack(outs, dim=2), S


# ---- linear attention ----------------------------------------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", DTYPES)
def test_linear_attention_parallel_equals_recurrent_and_cumsum(dtype, tol, ledger):
    q, k, v, *_ = inputs(dtype)
    q, k = q * DK ** -0.5, k * DK ** -0.5  # O(1) scores, so fp32 keeps ~1e-6 absolute
    parallel = linear_attention(q, k, v)
    recurrent, state = linear_attention_recurrent(q, k, v)
    assert parallel.shape == (B, H, T, DV) and state.shape == (B, H, DV, DK)
    ledger.check("linear attention, parallel form", "the recurrent form", parallel, recurrent,
                 tol=tol)
    # Independent: every prefix state at once as a cumulative sum of outer products v_s k_sᵀ.
    states = torch.cumsum(torch.einsum("bhtv,bhtk->bhtvk", v, k), dim=2)  # (B, H, T, Dv, Dk)
    ledger.check("linear attention output", "a cumulative sum of outer products v kᵀ", parallel,
                 torch.einsum("bhtvk,bhtk->bhtv", states, q), tol=tol)
    ledger.check("linear attention final state", "a cumulative sum of outer products v kᵀ", state,
                 states[:, :, -1], tol=tol)


def test_linear_attention_is_causal_and_not_normalised():
    q, k, v, *_ = inputs()
    v2 = v.clone()
    v2[:, :, 30:] += 1.0
    assert torch.equal(linear_attention(q, k, v)[:, :, :30], linear_attention(q, k, v2)[:, :, :30])
    # Doubling the keys doubles the output: no normalisation, no feature map.
    assert max_err(linear_attention(q, 2 * k, v), 2 * linear_attention(q, k, v)) < 1e-12


# ---- the delta rule against two formulations written differently ---------------------------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", DTYPES)
def test_delta_recurrent_equals_explicit_matrices(dtype, tol, ledger):
    q, k, v, alpha, beta, state = inputs(dtype, unit_keys=True)
    out, final = delta_rule_recurrent(q, k, v, beta, state, normalize=False)
    ref_out, ref_state = naive_delta(q, k, v, beta, state=state)
    assert out.dtype == dtype and final.dtype == dtype
    ledger.check("delta rule output", NAIVE, out, ref_out, tol=tol)
    ledger.check("delta rule final state", NAIVE, final, ref_state, tol=tol)
    out, final = gated_delta_rule_recurrent(q, k, v, alpha, beta, state, normalize=False)
    ref_out, ref_state = naive_delta(q, k, v, beta, alpha, state)
    ledger.check("gated delta rule output", NAIVE, out, ref_out, tol=tol)
    ledger.check("gated delta rule final state", NAIVE, final, ref_state, tol=tol)


@pytest.mark.equality
def test_delta_recurrent_is_online_regression_by_autograd(ledger):
    q, k, v, _, beta, _ = inputs()
    out, state = delta_rule_recurrent(q, k, v, beta)  # normalises q and k itself
    ref_out, ref_state = regression_delta(F.normalize(q, dim=-1), F.normalize(k, dim=-1), v, beta)
    ledger.check("delta rule output", REGRESSION, out, ref_out, tol=1e-12)
    ledger.check("delta rule final state", REGRESSION, state, ref_state, tol=1e-12)


def test_beta_one_overwrites_the_value_for_that_key():
    q, k, v, _, _, state = inputs(unit_keys=True)
    beta = torch.ones(B, H, T, dtype=torch.float64)
    _, final = delta_rule_recurrent(q, k, v, beta, state, normalize=False)
    recalled = final @ k[:, :, -1, :, None]  # (B, H, Dv, 1)
    assert max_err(recalled.squeeze(-1), v[:, :, -1]) < 1e-12


def test_gated_with_alpha_one_is_the_delta_rule():
    q, k, v, _, beta, state = inputs()
    ones = torch.ones(B, H, T, dtype=torch.float64)
    gated = gated_delta_rule_recurrent(q, k, v, ones, beta, state)
    plain = delta_rule_recurrent(q, k, v, beta, state)
    assert max_err(gated[0], plain[0]) < 1e-12 and max_err(gated[1], plain[1]) < 1e-12


# ---- chunked = recurrent --------------------------------------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", CHUNKED_DTYPES)
@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64])  # T = 50: ragged last chunk, and T < 64
@pytest.mark.parametrize("with_state", [False, True])
def test_delta_chunked_equals_recurrent(dtype, tol, chunk_size, with_state, ledger):
    q, k, v, _, beta, state = inputs(dtype)
    state = state if with_state else None
    out, final = delta_rule_chunked(q, k, v, beta, chunk_size=chunk_size, state=state)
    ref_out, ref_state = delta_rule_recurrent(q, k, v, beta, state)
    assert out.shape == (B, H, T, DV) and out.dtype == dtype
    ledger.check("delta rule chunked, output", "the recurrent form", out, ref_out, tol=tol)
    ledger.check("delta rule chunked, final state", "the recurrent form", final, ref_state,
                 tol=tol)


@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", CHUNKED_DTYPES)
@pytest.mark.parametrize("chunk_size", [1, 3, 16, 64])
@pytest.mark.parametrize("alpha_kind", ["random", "tiny", "one"])
def test_gated_chunked_equals_recurrent(dtype, tol, chunk_size, alpha_kind, ledger):
    q, k, v, alpha, beta, state = inputs(dtype)
    if alpha_kind == "tiny":  # γ underflows to 0 within a chunk: log space must give no NaN/inf
        alpha = torch.full_like(alpha, 1e-3)
    elif alpha_kind == "one":
        alpha = torch.ones_like(alpha)
    out, final = gated_delta_rule_chunked(q, k, v, alpha, beta, chunk_size=chunk_size,
                                          state=state)
    ref_out, ref_state = gated_delta_rule_recurrent(q, k, v, alpha, beta, state)
    assert torch.isfinite(out).all() and torch.isfinite(final).all()
    ledger.check("gated delta rule chunked, output", "the recurrent form", out, ref_out, tol=tol)
    ledger.check("gated delta rule chunked, final state", "the recurrent form", final, ref_state,
                 tol=tol)


@pytest.mark.equality
@pytest.mark.parametrize("T_short", [1, 5])
def test_chunked_short_sequences(T_short, ledger):
    q, k, v, alpha, beta, state = inputs(T=T_short)
    for chunked, recurrent, gates in ((delta_rule_chunked, delta_rule_recurrent, (beta,)),
                                      (gated_delta_rule_chunked, gated_delta_rule_recurrent,
                                       (alpha, beta))):
        out, final = chunked(q, k, v, *gates, chunk_size=4, state=state)
        ref_out, ref_state = recurrent(q, k, v, *gates, state)
        name = chunked.__name__
        ledger.check(f"{name}, output", "the recurrent form", out, ref_out, tol=1e-9)
        ledger.check(f"{name}, final state", "the recurrent form", final, ref_state, tol=1e-9)


# ---- continuing from a state ----------------------------------------------------------------

FORMS = {
    "linear": lambda q, k, v, a, b, s: linear_attention_recurrent(q, k, v, s),
    "delta": lambda q, k, v, a, b, s: delta_rule_recurrent(q, k, v, b, s),
    "delta_chunked": lambda q, k, v, a, b, s: delta_rule_chunked(q, k, v, b, chunk_size=16, state=s),
    "gated": lambda q, k, v, a, b, s: gated_delta_rule_recurrent(q, k, v, a, b, s),
    "gated_chunked": lambda q, k, v, a, b, s: gated_delta_rule_chunked(q, k, v, a, b, chunk_size=16,
                                                                         state=s),
}


@pytest.mark.equality
@pytest.mark.parametrize("name", FORMS)
def test_two_halves_with_the_state_equal_the_whole(name, ledger):
    form, cut = FORMS[name], 23  # not a multiple of the chunk: both halves are ragged
    q, k, v, alpha, beta, state = inputs()
    whole, whole_state = form(q, k, v, alpha, beta, state)
    first, mid = form(*(x[:, :, :cut] for x in (q, k, v, alpha, beta)), state)
    second, end = form(*(x[:, :, cut:] for x in (q, k, v, alpha, beta)), mid)
    ledger.check("output, two halves through the state", "one pass over the whole",
                 torch.cat([first, second], dim=2), whole, tol=1e-12)
    ledger.check("final state, two halves", "one pass over the whole", end, whole_state,
                 tol=1e-12)


# ---- normalised keys: why DeltaNet needs them -----------------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("fn", [delta_rule_recurrent, delta_rule_chunked])
def test_normalize_equals_prenormalised_keys(fn, ledger):
    q, k, v, _, beta, state = inputs()
    inside = fn(q, k, v, beta, state=state)
    unit_q, unit_k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    outside = fn(unit_q, unit_k, v, beta, state=state, normalize=False)
    ledger.check("output, normalize=True", "keys and queries normalised beforehand", inside[0],
                 outside[0], tol=1e-12)
    ledger.check("final state, normalize=True", "keys and queries normalised beforehand",
                 inside[1], outside[1], tol=1e-12)
    raw = fn(q, k, v, beta, state=state, normalize=False)  # the switch does change the result
    assert max_err(raw[0], inside[0]) > 1e-3


def test_unnormalised_keys_diverge_while_unit_keys_stay_bounded():
    q, k, v, _, _, state = inputs(T=300, unit_keys=True)
    beta = torch.full((B, H, 300), 0.95, dtype=torch.float64)
    # Unit keys: every factor I − β k kᵀ has eigenvalues 1 and 1 − β, so with v = 0 the state
    # can only shrink, and with random values it stays of the size of the values.
    zero_v = torch.zeros_like(v)
    _, shrunk = delta_rule_recurrent(q, k, zero_v, beta, state, normalize=False)
    assert (shrunk.flatten(2).norm(dim=-1) <= state.flatten(2).norm(dim=-1) * (1 + 1e-12)).all()
    S, largest = None, 0.0
    for t in range(300):  # one token at a time, to see every intermediate state
        one = slice(t, t + 1)
        _, S = delta_rule_recurrent(q[:, :, one], k[:, :, one], v[:, :, one], beta[:, :, one], S,
                                    normalize=False)
        largest = max(largest, S.flatten(2).norm(dim=-1).max().item())
    assert largest < 3 * v.norm(dim=-1).max().item()  # measured: 1.7 × the largest ‖v‖
    # Keys of norm 3: the eigenvalue 1 − 0.95·9 ≈ −7.6 expands the state at every step.
    _, blown = delta_rule_recurrent(q[:, :, :40], 3 * k[:, :, :40], v[:, :, :40], beta[:, :, :40],
                                    normalize=False)
    assert blown.flatten(2).norm(dim=-1).min().item() > 1e10


@pytest.mark.parametrize("squared", [1.5, 1.9, 2.0])
def test_keys_with_beta_k_squared_up_to_two_never_enlarge_the_state(squared):
    """The factor I − β k kᵀ has eigenvalue 1 − β‖k‖² along k: non-expansive iff β‖k‖² ≤ 2,
    so with v = 0 the state never grows, whatever the key's length below that bound."""
    q, k, _, _, _, state = inputs(T=200, unit_keys=True)
    k = k * squared ** 0.5  # β = 1, ‖k‖² = squared
    beta = torch.ones(B, H, 200, dtype=torch.float64)
    _, S = delta_rule_recurrent(q, k, torch.zeros(B, H, 200, DV, dtype=torch.float64), beta,
                                state, normalize=False)
    assert (S.flatten(2).norm(dim=-1) <= state.flatten(2).norm(dim=-1) * (1 + 1e-12)).all()


def test_keys_with_beta_k_squared_above_two_enlarge_the_state():
    """Just past the bound (β‖k‖² = 2.5) the state grows geometrically, even with v = 0."""
    q, k, _, _, _, state = inputs(T=200, unit_keys=True)
    beta = torch.ones(B, H, 200, dtype=torch.float64)
    _, S = delta_rule_recurrent(q, k * 2.5 ** 0.5, torch.zeros(B, H, 200, DV, dtype=torch.float64),
                                beta, state, normalize=False)
    assert (S.flatten(2).norm(dim=-1) > 1e4 * state.flatten(2).norm(dim=-1)).all()  # ~4e5 ×


# ---- gradients -------------------------------------------------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("gated", [False, True])
def test_chunked_and_recurrent_give_the_same_gradients(gated, ledger):
    q, k, v, alpha, beta, state = inputs(T=37)
    leaves = [x.requires_grad_(True) for x in (q, k, v, alpha, beta, state)]
    out_cot, state_cot = torch.randn(B, H, 37, DV, dtype=torch.float64), torch.randn_like(state)

    def grads(fn, *args, **kwargs):
        out, final = fn(*args, **kwargs)
        loss = (out * out_cot).sum() + (final * state_cot).sum()
        return torch.autograd.grad(loss, leaves if gated else leaves[:3] + leaves[4:])

    if gated:
        chunked = grads(gated_delta_rule_chunked, q, k, v, alpha, beta, chunk_size=8, state=state)
        recurrent = grads(gated_delta_rule_recurrent, q, k, v, alpha, beta, state)
    else:
        chunked = grads(delta_rule_chunked, q, k, v, beta, chunk_size=8, state=state)
        recurrent = grads(delta_rule_recurrent, q, k, v, beta, state)
    names = ["q", "k", "v", "alpha", "beta", "state"] if gated else ["q", "k", "v", "beta", "state"]
    for name, a, b in zip(names, chunked, recurrent):
        assert a.abs().max() > 1e-3  # every input matters
        ledger.check(f"gradient of {name}, chunked", "the recurrent form's, by autograd", a, b,
                     tol=1e-9)


def test_tiny_alpha_gives_finite_gradients_in_fp32():
    q, k, v, _, beta, state = inputs(torch.float32)
    alpha = torch.full((B, H, T), 1e-3).requires_grad_(True)
    out, final = gated_delta_rule_chunked(q, k, v, alpha, beta, chunk_size=64, state=state)
    (grad,) = torch.autograd.grad(out.sum() + final.sum(), alpha)
    assert torch.isfinite(grad).all()


# ---- half precision ---------------------------------------------------------------------------

@pytest.mark.parametrize("fn", [delta_rule_chunked, delta_rule_recurrent])
def test_bfloat16_is_computed_in_fp32_and_cast_back(fn):
    q, k, v, _, beta, state = (x.bfloat16() for x in inputs(torch.float32))
    out, final = fn(q, k, v, beta, state=state)
    ref_out, ref_state = fn(*(x.float() for x in (q, k, v, beta)), state=state.float())
    assert out.dtype == torch.bfloat16 and final.dtype == torch.bfloat16
    assert torch.equal(out, ref_out.bfloat16()) and torch.equal(final, ref_state.bfloat16())
    half = linear_attention(q, k, v)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, linear_attention(q.float(), k.float(), v.float()).bfloat16())


# ---- bad input --------------------------------------------------------------------------------

def bad_calls():
    q, k, v, alpha, beta, state = inputs()
    return [
        (lambda: delta_rule_recurrent(q, k[:, :, :-1], v, beta), r"q \(2, 3, 50, 8\) and k"),
        (lambda: delta_rule_recurrent(q, k[..., :-1], v, beta), "must have the same shape"),
        (lambda: linear_attention(q, k, v[:, :2]), r"v \(2, 2, 50, 6\) must have the same"),
        (lambda: linear_attention(q[0], k[0], v[0]), "must have 4 dimensions"),
        (lambda: delta_rule_chunked(q, k, v, beta[..., :-1]),
         r"beta must have shape .* \(2, 3, 49\)"),
        (lambda: delta_rule_recurrent(q, k, v, beta, state.transpose(-2, -1)),
         r"state must have shape \(B, H, Dv, Dk\) = \(2, 3, 6, 8\), got \(2, 3, 8, 6\)"),
        (lambda: delta_rule_recurrent(q, k, v, beta * 0), r"beta must be in \(0, 1\], got min 0"),
        (lambda: delta_rule_chunked(q, k, v, beta + 1), r"beta must be in \(0, 1\].*max 1.9"),
        (lambda: gated_delta_rule_recurrent(q, k, v, alpha * 0, beta),
         r"alpha must be in \(0, 1\]"),
        (lambda: gated_delta_rule_chunked(q, k, v, alpha + 0.5, beta), r"alpha must be in"),
        (lambda: delta_rule_recurrent(q, k, v, beta.clone().fill_(float("nan"))),
         "beta contains NaN"),
        (lambda: gated_delta_rule_chunked(q, k, v, alpha.clone().fill_(float("nan")), beta),
         "alpha contains NaN"),
        (lambda: delta_rule_chunked(q, k, v, beta, chunk_size=0),
         "chunk_size must be positive, got 0"),
        (lambda: gated_delta_rule_chunked(q, k, v, alpha, beta, chunk_size=2.5),
         "chunk_size must be an integer"),
        (lambda: linear_attention(q.long(), k, v),
         "q must be a floating-point tensor, got torch.int64"),
        (lambda: linear_attention_recurrent(q, k, v.float()),
         "must share one dtype.*v torch.float32"),
        (lambda: delta_rule_recurrent(q[:, :, :0], k[:, :, :0], v[:, :, :0], beta[:, :, :0]),
         "T must be at least 1"),
    ]


@pytest.mark.parametrize("case", range(len(bad_calls())))
def test_bad_input_raises_a_named_value_error(case):
    call, message = bad_calls()[case]
    with pytest.raises(ValueError, match=message):
        call()
