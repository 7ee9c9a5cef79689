import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from transformer_lib.norms import LayerNorm, RMSNorm, layer_norm, rms_norm

from conftest import randomize_, require


@pytest.mark.equality
def test_layernorm_matches_torch(ledger):
    ref = randomize_(nn.LayerNorm(32, eps=1e-5))
    ours = LayerNorm(32, eps=1e-5)
    ours.load_state_dict(ref.state_dict())
    x = 3 + 2 * torch.randn(4, 7, 32)
    ledger.check("LayerNorm", ledger.torch("nn.LayerNorm"), ours(x), ref(x), tol=1e-5)


@pytest.mark.equality
def test_rmsnorm_matches_torch_and_hf(ledger):
    ref = nn.RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        ref.weight.copy_(1 + 0.3 * torch.randn(32))
    ours = RMSNorm(32, eps=1e-6)
    ours.load_state_dict(ref.state_dict())
    x = 1 + 2 * torch.randn(4, 7, 32)
    ledger.check("RMSNorm", ledger.torch("nn.RMSNorm"), ours(x), ref(x), tol=1e-6)
    llama = require("transformers.models.llama.modeling_llama")
    hf = llama.LlamaRMSNorm(32, eps=1e-6)
    hf.load_state_dict(ref.state_dict())
    ledger.check("RMSNorm, Llama's", ledger.hf("LlamaRMSNorm"), ours(x), hf(x), tol=1e-6)


@pytest.mark.equality
def test_rmsnorm_has_no_mean_subtraction_and_no_bias(ledger):
    norm = RMSNorm(4)
    assert [n for n, _ in norm.named_parameters()] == ["weight"]
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    # The mean square (7.5) is not the variance (1.25): RMSNorm keeps the mean.
    ledger.check("RMSNorm of [1, 2, 3, 4]", "x / √(7.5 + 1e-6) by hand", norm(x),
                 x / torch.sqrt(torch.tensor(7.5 + 1e-6)), tol=1e-6)
    assert norm(x).mean() > 0.5


@pytest.mark.equality
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_low_precision_is_computed_in_fp32_and_cast_back(dtype, ledger):
    norm = RMSNorm(64)
    x = (300 * torch.randn(2, 64)).to(dtype)  # x² overflows fp16's range (65504)
    y = norm(x)
    assert y.dtype == dtype
    expected = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    ledger.check(f"RMSNorm of {dtype} inputs ~300", "the fp32 formula rounded once", y, expected,
                 tol=0)
    assert torch.isfinite(y).all()


@pytest.mark.equality
def test_norms_keep_fp64(ledger):
    x = torch.randn(3, 16, dtype=torch.float64)
    for name, norm, expected in (
        ("RMSNorm", RMSNorm(16).double(), x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()),
        ("LayerNorm", LayerNorm(16).double(), (x - x.mean(-1, keepdim=True))
         / x.var(-1, unbiased=False, keepdim=True).add(1e-5).sqrt()),
    ):
        y = norm(x)
        assert y.dtype == torch.float64
        ledger.check(f"{name} in fp64", "the formula written out", y, expected, tol=1e-12)


@pytest.mark.parametrize("cls", [LayerNorm, RMSNorm])
def test_bad_norm_arguments_are_rejected(cls):
    with pytest.raises(ValueError, match="d must be positive, got 0"):
        cls(0)
    with pytest.raises(ValueError, match="eps must be positive, got -1"):
        cls(8, eps=-1)



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_functional_norms_match_torchs_with_random_scales(dtype):
    """The functions the modules (and chapter 4's cells) use, against ``F.layer_norm`` and
    ``F.rms_norm`` in float64, rounded once to ``dtype``."""
    x = 3 + 2 * torch.randn(4, 7, 32, dtype=torch.float64)
    weight = 1 + 0.3 * torch.randn(32, dtype=torch.float64)
    bias = 0.2 * torch.randn(32, dtype=torch.float64)
    want_ln = F.layer_norm(x, (32,), weight, bias, 1e-5).to(dtype)
    want_rms = F.rms_norm(x, (32,), weight, 1e-6).to(dtype)
    got_ln = layer_norm(x.to(dtype), weight.to(dtype), bias.to(dtype), 1e-5)
    got_rms = rms_norm(x.to(dtype), weight.to(dtype), 1e-6)
    assert got_ln.dtype == got_rms.dtype == dtype
    tol = 5e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(got_ln, want_ln, atol=tol, rtol=tol)
    torch.testing.assert_close(got_rms, want_rms, atol=tol, rtol=tol)
