import pytest
import torch
import torch.nn.functional as F

from transformer_lib.ffn import FeedForward, SwiGLU

from conftest import randomize_, require


@pytest.mark.equality
def test_feedforward_is_the_2017_formula(ledger):
    ffn = randomize_(FeedForward(16, 64)).eval()
    x = torch.randn(3, 5, 16)
    h = torch.clamp(x @ ffn.w_1.weight.T + ffn.w_1.bias, min=0)  # max(0, x W1 + b1)
    ledger.check("FeedForward", "max(0, x W1 + b1) W2 + b2 written out", ffn(x),
                 h @ ffn.w_2.weight.T + ffn.w_2.bias, tol=1e-5)


@pytest.mark.equality
def test_feedforward_without_biases_matches_swiglu_budget_at_three_halves_width(ledger):
    ffn = randomize_(FeedForward(16, 60, bias=False)).eval()
    assert ffn.w_1.bias is None and ffn.w_2.bias is None
    x = torch.randn(3, 5, 16)
    ledger.check("FeedForward without biases", "relu(x W1) W2 written out", ffn(x),
                 torch.relu(x @ ffn.w_1.weight.T) @ ffn.w_2.weight.T, tol=1e-6)
    n_ffn = sum(p.numel() for p in ffn.parameters())
    assert n_ffn == sum(p.numel() for p in SwiGLU(16, 40).parameters()) == 2 * 16 * 60


@pytest.mark.equality
def test_swiglu_matches_hf_llama_mlp(ledger):
    llama = require("transformers.models.llama.modeling_llama")
    transformers = require("transformers")
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_attention_heads=2)
    ref = randomize_(llama.LlamaMLP(cfg))
    ours = SwiGLU(16, 40)
    ours.load_state_dict(ref.state_dict())  # same names: gate_proj, up_proj, down_proj
    x = torch.randn(3, 5, 16)
    ledger.check("SwiGLU", ledger.hf("LlamaMLP"), ours(x), ref(x), tol=1e-5)
    manual = (F.silu(x @ ours.gate_proj.weight.T) * (x @ ours.up_proj.weight.T)) @ ours.down_proj.weight.T
    ledger.check("SwiGLU, formula", "(silu(x W_gate) ⊙ x W_up) W_down written out", ours(x),
                 manual, tol=1e-5)


def test_swiglu_with_eight_thirds_width_matches_ffn_parameter_count():
    # Claim C27: three matrices of d·h with h = 8/3·d equal two matrices of d·4d.
    d = 48
    swiglu = SwiGLU(d, 8 * d // 3)
    n_swiglu = sum(p.numel() for p in swiglu.parameters())
    ffn = FeedForward(d, 4 * d)
    n_ffn_weights = sum(p.numel() for n, p in ffn.named_parameters() if n.endswith("weight"))
    assert n_swiglu == 3 * d * (8 * d // 3) == n_ffn_weights == 8 * d * d


@pytest.mark.parametrize("cls", [FeedForward, SwiGLU])
def test_bad_ffn_sizes_are_rejected(cls):
    with pytest.raises(ValueError, match="d_ff must be positive, got 0"):
        cls(8, 0)
    with pytest.raises(ValueError, match="d_model must be positive, got -1"):
        cls(-1, 8)
