import pytest
import torch
import torch.nn as nn

from transformer_lib.norms import LayerNorm, RMSNorm

from conftest import randomize_, require


def test_layernorm_matches_torch():
    ref = randomize_(nn.LayerNorm(32, eps=1e-5))
    ours = LayerNorm(32, eps=1e-5)
    ours.load_state_dict(ref.state_dict())
    x = 3 + 2 * torch.randn(4, 7, 32)
    assert torch.allclose(ours(x), ref(x), atol=1e-5)


def test_rmsnorm_matches_torch_and_hf():
    ref = nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(32))
    ours = RMSNorm(32, eps=1e-6)
    ours.load_state_dict(ref.state_dict())
    x = 1 + 2 * torch.randn(4, 7, 32)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    llama = require("transformers.models.llama.modeling_llama")
    hf = llama.LlamaRMSNorm(32, eps=1e-6)
    hf.load_state_dict(ref.state_dict())
    assert torch.allclose(ours(x), hf(x), atol=1e-6)


def test_rmsnorm_has_no_mean_subtraction_and_no_bias():
    norm = RMSNorm(4)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    # The mean square (7.5) is not the variance (1.25): RMSNorm keeps the mean.
    assert torch.allclose(norm(x), x / torch.sqrt(torch.tensor(7.5 + 1e-6)))
    assert norm(x).mean() > 0.5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_low_precision_is_computed_in_fp32_and_cast_back(dtype):
    norm = RMSNorm(64)
    x = (300 * torch.randn(2, 64)).to(dtype)  # x² overflows fp16's range (65504)
    y = norm(x)
    assert y.dtype == dtype
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    assert torch.equal(y, expected)
    assert torch.isfinite(y).all()


def test_norms_keep_fp64():
    x = torch.randn(3, 16, dtype=torch.float64)
    for norm, expected in (
        (RMSNorm(16).double(), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()),
        (LayerNorm(16).double(), (x - x.mean(-1, keepdim=True))
         / x.var(-1, unbiased=False, keepdim=True).add(1e-5).sqrt()),
    ):
        y = norm(x)
        assert y.dtype == torch.float64
        assert (y - expected).abs().max() < 1e-12


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_bad_norm_arguments_are_rejected(cls):
    with pytest.raises(ValueError, match="d must be positive, got 0"):
        cls(0)
    with pytest.raises(ValueError, match="eps must be positive, got -1"):
        cls(8, eps=-1)
