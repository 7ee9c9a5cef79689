import pytest
import torch
import torch.nn.functional as F

from transformer_lib.variants.moe import MoEFeedForward, load_balancing_loss

from conftest import randomize_, require

# fp32: a few ops on O(1) values -> 1e-6 relative per op, 1e-5 absolute after the sums;
# fp64: 1e-12.
TOLS = [(torch.float32, 1e-5), (torch.float64, 1e-12)]


def random_moe(n_experts=4, top_k=2, dtype=torch.float32, d_model=16, d_ff=24) -> MoEFeedForward:
    """A layer with random weights that keeps its last routing (``keep_weights=True``)."""
    moe = MoEFeedForward(d_model, d_ff, n_experts, top_k, keep_weights=True)
    return randomize_(moe, std=0.3).to(dtype)


def dense_reference(moe: MoEFeedForward, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, weighted by a dense (N, E) gate matrix that is zero for
    the experts a token did not choose; top-k by sorting, SwiGLU written out."""
    flat = x.reshape(-1, x.shape[-1])  # (N, C)
    logits = flat @ moe.router.weight.T  # (N, E)
    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)  # (N, E)
    order = probs.argsort(dim=-1, descending=True)[:, :moe.top_k]  # (N, k)
    chosen = torch.zeros_like(probs).scatter(1, order, 1.0)  # (N, E) 1 where chosen
    dense_gates = probs * chosen / (probs * chosen).sum(dim=-1, keepdim=True)  # (N, E)
    out = torch.zeros_like(flat)
    for e, expert in enumerate(moe.experts):
        hidden = F.silu(flat @ expert.gate_proj.weight.T) * (flat @ expert.up_proj.weight.T)
        out = out + dense_gates[:, e:e + 1] * (hidden @ expert.down_proj.weight.T)  # (N, C)
    return out.reshape(x.shape)


DENSE = "every expert on every token, dense gates written out"


# ---- (a) equal to a dense reference that runs every expert on every token ---------------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", TOLS)
@pytest.mark.parametrize("n_experts, top_k", [(4, 1), (4, 2), (4, 3), (4, 4), (6, 2), (1, 1)])
def test_matches_dense_reference(dtype, tol, n_experts, top_k, ledger):
    moe = random_moe(n_experts, top_k, dtype)
    x = torch.randn(3, 10, 16, dtype=dtype)
    with torch.no_grad():
        out, _ = moe(x)
        assert out.shape == x.shape
        ledger.check(f"MoE output, top {top_k} of {n_experts}", DENSE, out,
                     dense_reference(moe, x), tol=tol)


@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", TOLS)
def test_top_k_equal_to_n_experts_is_the_dense_softmax_mixture(dtype, tol, ledger):
    moe = random_moe(4, 4, dtype)
    x = torch.randn(2, 7, 16, dtype=dtype)
    with torch.no_grad():
        out, _ = moe(x)
        probs = torch.softmax(moe.router(x), dim=-1)  # (B, T, E): no renormalising needed
        mixture = sum(probs[..., e:e + 1] * expert(x) for e, expert in enumerate(moe.experts))
    ledger.check("MoE output, top 4 of 4", "the softmax mixture of every expert", out, mixture,
                 tol=tol)


@pytest.mark.equality
def test_top_1_uses_one_expert_per_token_with_gate_1(ledger):
    moe = random_moe(4, 1)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        out, _ = moe(x)
        choice = moe.router(x).argmax(dim=-1)  # (B, T)
        single = torch.stack([moe.experts[int(e)](x[b, t]) for b, t, e in
                              ((b, t, choice[b, t]) for b in range(2) for t in range(9))])
    assert torch.equal(moe.last_expert_index[..., 0], choice)
    ledger.check("MoE output, top 1", "the argmax expert alone, gate 1", out.reshape(18, 16),
                 single, tol=1e-5)


def test_each_expert_sees_only_its_tokens():
    moe = random_moe(4, 2)
    seen = {}
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda m, args, out, e=e: seen.update({e: args[0].shape[0]}))
    x = torch.randn(2, 15, 16)
    with torch.no_grad():
        moe(x)
    load = torch.bincount(moe.last_expert_index.flatten(), minlength=4)
    assert sum(seen.values()) == 30 * 2  # N·k token-slots, not N·E
    assert all(seen.get(e, 0) == int(load[e]) for e in range(4))


# ---- (b) equal to Hugging Face's Mixtral sparse MoE block -------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("n_experts, top_k", [(4, 2), (8, 2), (4, 1), (4, 4)])
def test_matches_hf_mixtral_sparse_moe_block(n_experts, top_k, ledger):
    """HF's router computes its softmax in fp32 even for fp64 input, so this runs in fp32."""
    transformers = require("transformers")
    mixtral = require("transformers.models.mixtral.modeling_mixtral")
    config = transformers.MixtralConfig(hidden_size=16, intermediate_size=24,
                                        num_local_experts=n_experts, num_experts_per_tok=top_k)
    config._experts_implementation = "eager"  # HF's reference loop over experts
    hf = randomize_(mixtral.MixtralSparseMoeBlock(config), std=0.3).eval()
    ours = MoEFeedForward(16, 24, n_experts, top_k)
    with torch.no_grad():  # HF stores the experts fused: gate_up_proj (E, 2·d_ff, C) = [gate; up]
        ours.router.weight.copy_(hf.gate.weight)
        for e, expert in enumerate(ours.experts):
            gate, up = hf.experts.gate_up_proj[e].chunk(2, dim=0)  # (d_ff, C) each
            expert.gate_proj.weight.copy_(gate)
            expert.up_proj.weight.copy_(up)
            expert.down_proj.weight.copy_(hf.experts.down_proj[e])  # (C, d_ff)
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        out, aux = ours(x)
        ledger.check(f"MoE output, top {top_k} of {n_experts}",
                     ledger.hf("MixtralSparseMoeBlock"), out, hf(x), tol=1e-5)
        # HF's Mixtral loss divides the expert counts by N, not N·k: k times ours.
        logits = hf.gate(x)[0]  # (N, E)
        hf_aux = mixtral.load_balancing_loss_func((logits,), n_experts, top_k)
    ledger.check("load-balancing loss × k", ledger.hf("load_balancing_loss_func"), top_k * aux,
                 hf_aux, tol=1e-5)


# ---- (c) the load-balancing loss --------------------------------------------------------

@pytest.mark.equality
def test_aux_loss_matches_its_formula_computed_by_hand(ledger):
    moe = random_moe(5, 2, torch.float64)
    x = torch.randn(4, 6, 16, dtype=torch.float64)
    _, aux = moe(x)
    probs = moe.last_router_probs.reshape(-1, 5)  # (N, E)
    chosen = moe.last_expert_index.reshape(-1, 2).tolist()  # (N, k)
    N = len(chosen)
    f = [sum(row.count(i) for row in chosen) / (N * 2) for i in range(5)]
    P = [sum(probs[n, i].item() for n in range(N)) / N for i in range(5)]
    expected = 5 * sum(f_i * P_i for f_i, P_i in zip(f, P))
    ledger.record("load-balancing loss of the layer", "E · Σ f_i P_i in Python floats",
                  "float64", abs(aux.item() - expected), tol=1e-12)
    ledger.record("load_balancing_loss", "E · Σ f_i P_i in Python floats", "float64",
                  abs(load_balancing_loss(probs, moe.last_expert_index.reshape(-1, 2), 5).item()
                      - expected), tol=1e-12)


@pytest.mark.parametrize("top_k", [1, 2])
def test_aux_loss_is_one_for_a_uniform_router(top_k):
    moe = random_moe(4, top_k, torch.float64)
    torch.nn.init.zeros_(moe.router.weight)  # every expert gets probability 1/4
    _, aux = moe(torch.randn(3, 8, 16, dtype=torch.float64))
    assert abs(aux.item() - 1.0) <= 1e-12


def test_aux_loss_is_one_for_an_even_split_and_grows_as_the_router_collapses():
    E, C = 4, 16
    moe = random_moe(E, 1, torch.float64, d_model=C)
    x = torch.zeros(1, 8, C, dtype=torch.float64)
    x[0, torch.arange(8), torch.arange(8) % E] = 1.0  # token t points along axis t mod 4
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[:, :E] = 3.0 * torch.eye(E)  # token t prefers expert t mod 4
    _, balanced = moe(x)
    assert torch.bincount(moe.last_expert_index.flatten(), minlength=E).tolist() == [2, 2, 2, 2]
    assert abs(balanced.item() - 1.0) <= 1e-12  # f_i = 1/4 makes Σ f_i P_i = 1/4 exactly
    with torch.no_grad():
        moe.router.weight.zero_()
        moe.router.weight[0, :E] = 20.0  # every token prefers expert 0, with p ≈ 1
    _, collapsed = moe(x)
    assert moe.last_expert_index.unique().tolist() == [0]
    assert E - 1e-6 < collapsed.item() <= E  # the worst case: n_experts


# ---- (d) gradients reach the router through the gates ------------------------------------

@pytest.mark.equality
def test_router_gradient_flows_through_the_gates_and_matches_the_dense_reference(ledger):
    moe = random_moe(4, 2, torch.float64)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    weights = torch.randn(2, 8, 16, dtype=torch.float64)
    out, _ = moe(x)
    (out * weights).sum().backward()  # the output alone, no aux loss
    ours = moe.router.weight.grad.clone()
    moe.zero_grad()
    (dense_reference(moe, x) * weights).sum().backward()
    assert ours.abs().max().item() > 1e-3
    ledger.check("router gradient", DENSE + ", by autograd", ours, moe.router.weight.grad,
                 tol=1e-12)


def test_gradcheck_through_routing():
    moe = random_moe(4, 2, torch.float64, d_model=6, d_ff=5)
    x = torch.randn(1, 5, 6, dtype=torch.float64, requires_grad=True)
    # Routing is piecewise constant in x; the small default eps keeps it fixed.
    assert torch.autograd.gradcheck(lambda inp: moe(inp)[0], (x,))


def test_aux_loss_trains_the_router():
    moe = random_moe(4, 2)
    _, aux = moe(torch.randn(2, 8, 16))
    aux.backward()
    assert moe.router.weight.grad.abs().max().item() > 0.0
    assert all(p.grad is None for p in moe.experts.parameters())  # the loss sees only the router


# ---- parameters: capacity grows with n_experts, per-token compute with top_k -------------

def test_parameter_counts():
    C, F_, E, k = 16, 24, 8, 2
    moe = MoEFeedForward(C, F_, E, k)
    assert sum(p.numel() for p in moe.parameters()) == E * 3 * C * F_ + C * E
    assert moe.active_parameters == k * 3 * C * F_ + C * E
    assert MoEFeedForward(C, F_, 2 * E, k).active_parameters - moe.active_parameters == C * E


def test_half_precision_routes_in_fp32():
    moe = random_moe(4, 2).to(torch.bfloat16)
    out, aux = moe(torch.randn(2, 5, 16, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16
    assert moe.last_router_probs.dtype == torch.float32 and aux.dtype == torch.float32


# ---- (e) bad input gets a named ValueError ----------------------------------------------

@pytest.mark.parametrize("args, message", [
    ((16, 24, 2, 3), r"top_k \(3\) must be <= n_experts \(2\)"),
    ((16, 24, 4, 0), "top_k must be positive, got 0"),
    ((0, 24, 4, 2), "d_model must be positive, got 0"),
    ((16, -1, 4, 2), "d_ff must be positive, got -1"),
    ((16, 24, 0, 1), "n_experts must be positive, got 0"),
])
def test_bad_sizes_raise(args, message):
    with pytest.raises(ValueError, match=message):
        MoEFeedForward(*args)


def test_bad_input_raises():
    moe = MoEFeedForward(16, 24, 4, 2)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 16\), got \(2, 5, 8\)"):
        moe(torch.randn(2, 5, 8))
    probs = torch.softmax(torch.randn(6, 4), dim=-1)
    with pytest.raises(ValueError, match=r"router_probs must have shape \(\.\.\., 3\)"):
        load_balancing_loss(probs, torch.zeros(6, 1, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"expert_index must be in \[0, 3\], got min 0, max 4"):
        load_balancing_loss(probs, torch.tensor([[0], [4], [1], [1], [2], [3]]), 4)
    with pytest.raises(ValueError, match="must agree on the token dimensions"):
        load_balancing_loss(probs, torch.zeros(5, 1, dtype=torch.long), 4)
