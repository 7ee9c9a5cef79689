import math

import pytest
import torch

from transformer_lib.attention import causal_mask
from transformer_lib.cache import KVCache
from transformer_lib.variants.mla import MLACache, MLAConfig, MultiHeadLatentAttention

from conftest import randomize_, require

# fp32: ~1e-7 relative error per op over a few ops on O(1) values -> 1e-5 absolute;
# fp64: the same paths at ~1e-16 per op -> 1e-12.
TOLS = [(torch.float32, 1e-5), (torch.float64, 1e-12)]
SIZES = dict(d_model=64, n_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
             v_head_dim=12, max_seq_len=64)


def random_mla(dtype=torch.float32, **overrides) -> MultiHeadLatentAttention:
    config = MLAConfig(**{**SIZES, **overrides})
    return randomize_(MultiHeadLatentAttention(config), std=0.1).to(dtype).eval()


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ---- (a) the same function as Hugging Face's DeepseekV3Attention ------------------------

def _hf_pair(q_lora_rank, rope_interleave, dtype, attn_implementation="eager"):
    """A Hugging Face DeepseekV3Attention with random weights (norm weights too) and ours with
    its state dict loaded."""
    transformers = require("transformers")
    ds = require("transformers.models.deepseek_v3.modeling_deepseek_v3")
    hf_config = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=q_lora_rank, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
        max_position_embeddings=64, rope_interleave=rope_interleave, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf_config._attn_implementation = attn_implementation  # both take our explicit causal mask
    hf = randomize_(ds.DeepseekV3Attention(hf_config, layer_idx=0), std=0.1).to(dtype).eval()
    ours = MultiHeadLatentAttention(MLAConfig(
        **SIZES, q_lora_rank=q_lora_rank,
        rope_pairing="interleaved" if rope_interleave else "half")).to(dtype).eval()
    ours.load_state_dict(hf.state_dict())  # same names, strict: nothing missing or left over
    return hf, ours, ds.DeepseekV3RotaryEmbedding(hf_config)


def _hf_forward(hf, x, cos, sin):
    T = x.shape[1]
    additive = torch.zeros(T, T, dtype=x.dtype).masked_fill(~causal_mask(T), float("-inf"))
    out, _ = hf(x, (cos, sin), additive[None, None])  # mask (1, 1, T, T)
    return out


@pytest.mark.equality
@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_matches_hf_deepseek_v3_attention_fp32(q_lora_rank, rope_interleave, ledger):
    hf, ours, rotary = _hf_pair(q_lora_rank, rope_interleave, torch.float32)
    x = torch.randn(2, 40, 64)
    cos, sin = rotary(x, torch.arange(40)[None])  # HF's own RoPE tables (B, T, D_r)
    with torch.no_grad():
        ref = _hf_forward(hf, x, cos, sin)
        for absorb in (False, True):
            ledger.check(f"MLA output, absorb={absorb}", ledger.hf("DeepseekV3Attention (eager)"),
                         ours(x, absorb=absorb), ref, tol=1e-5)
    # The RoPE layout matters: the other pairing is a different function.
    other = "half" if rope_interleave else "interleaved"
    wrong = MultiHeadLatentAttention(MLAConfig(**SIZES, q_lora_rank=q_lora_rank,
                                               rope_pairing=other)).eval()
    wrong.load_state_dict(hf.state_dict())
    with torch.no_grad():
        assert max_err(wrong(x), ref) > 1e-3


@pytest.mark.equality
@pytest.mark.parametrize("q_lora_rank", [None, 24])
@pytest.mark.parametrize("rope_interleave", [True, False])
def test_matches_hf_deepseek_v3_attention_fp64(q_lora_rank, rope_interleave, ledger):
    """HF computes its RMSNorm, RoPE angles and eager softmax in fp32 even for fp64 inputs.
    For a 1e-12 comparison its two norms become torch.nn.RMSNorm (same weights, computed in
    fp64), its attention runs through PyTorch's SDPA ("sdpa", fp64 throughout), and the RoPE
    tables are built here in fp64 in HF's layout cat(freqs, freqs)."""
    hf, ours, _ = _hf_pair(q_lora_rank, rope_interleave, torch.float64, "sdpa")
    for name in ("q_a_layernorm", "kv_a_layernorm"):
        norm = getattr(hf, name)
        if norm is not None:
            exact = torch.nn.RMSNorm(norm.weight.shape[0], eps=1e-6, dtype=torch.float64)
            exact.weight.data.copy_(norm.weight.data)
            setattr(hf, name, exact)
    T, D_r = 40, 8
    inv_freq = 10000.0 ** (-torch.arange(0, D_r, 2, dtype=torch.float64) / D_r)  # (D_r/2,)
    freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, D_r/2)
    emb = torch.cat([freqs, freqs], dim=-1)[None]  # (1, T, D_r)
    x = torch.randn(2, T, 64, dtype=torch.float64)
    with torch.no_grad():
        ref = _hf_forward(hf, x, emb.cos(), emb.sin())
        for absorb in (False, True):
            ledger.check(f"MLA output, absorb={absorb}",
                         ledger.hf("DeepseekV3Attention (sdpa, fp64 norms and RoPE tables)"),
                         ours(x, absorb=absorb), ref, tol=1e-12)


# ---- (b) cached decoding equals the full causal pass ------------------------------------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", TOLS)
@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_cached_decoding_matches_full_pass(dtype, tol, absorb, q_lora_rank, ledger):
    mla = random_mla(dtype, q_lora_rank=q_lora_rank)
    x = torch.randn(3, 30, 64, dtype=dtype)
    with torch.no_grad():
        full = mla(x)  # (B, 30, C)
        cache = mla.new_cache(3)
        pieces = [mla(x[:, :10], cache, absorb=absorb)]  # prefill
        pieces += [mla(x[:, i:i + 1], cache, absorb=absorb) for i in range(10, 16)]  # one by one
        pieces += [mla(x[:, 16:30], cache, absorb=absorb)]  # a chunk after a cached prefix
    assert cache.pos == 30
    ledger.check("MLA output decoded with the latent cache", "the full causal pass",
                 torch.cat(pieces, dim=1), full, tol=tol)


def test_later_tokens_never_change_earlier_outputs():
    mla = random_mla()
    x = torch.randn(2, 12, 64)
    changed = x.clone()
    changed[:, 7] += 1.0
    with torch.no_grad():
        a, b = mla(x), mla(changed)
    assert max_err(a[:, :7], b[:, :7]) == 0.0  # causal: exactly equal
    assert max_err(a[:, 7:], b[:, 7:]) > 1e-3


# ---- (c) absorbed = explicit, and the cache holds only the latent and the RoPE key ------

@pytest.mark.equality
@pytest.mark.parametrize("dtype, tol", TOLS)
@pytest.mark.parametrize("q_lora_rank", [None, 24])
def test_absorbed_equals_explicit(dtype, tol, q_lora_rank, ledger):
    mla = random_mla(dtype, q_lora_rank=q_lora_rank)
    x = torch.randn(2, 25, 64, dtype=dtype)
    with torch.no_grad():
        ledger.check("MLA output, absorbed", "the explicit up-projection", mla(x, absorb=True),
                     mla(x, absorb=False), tol=tol)


def test_absorbed_path_never_up_projects_the_cache():
    mla = random_mla()
    calls = []
    mla.kv_b_proj.register_forward_hook(lambda module, args, out: calls.append(out.shape))
    cache = mla.new_cache(2, max_seq_len=20)
    x = torch.randn(2, 20, 64)
    with torch.no_grad():
        mla(x[:, :12], cache, absorb=True)
        for i in range(12, 20):
            mla(x[:, i:i + 1], cache, absorb=True)
    assert calls == []  # no per-head keys/values were made
    with torch.no_grad():
        mla(x, absorb=False)
    assert calls == [(2, 20, 4 * (16 + 12))]  # the explicit path makes them: (B, S, H*(D_n+D_v))
    # What the cache holds: the latent (B, S, d_c) and the RoPE key (B, S, D_r), nothing else.
    assert set(vars(cache)) == {"c_kv", "k_rope", "max_seq_len", "pos"}
    assert cache.c_kv.shape == (2, 20, 32) and cache.k_rope.shape == (2, 20, 8)
    assert cache.nbytes == 2 * 20 * (32 + 8) * 4


def test_cache_stores_the_normalised_latent_and_rotated_key():
    mla = random_mla()
    x = torch.randn(1, 5, 64)
    cache = mla.new_cache(1)
    with torch.no_grad():
        mla(x, cache, absorb=True)
        c_kv, k_rope = mla.kv_a_proj_with_mqa(x).split([32, 8], dim=-1)
        latent = mla.kv_a_layernorm(c_kv)
    assert max_err(cache.c_kv[:, :5], latent) <= 1e-6
    assert (cache.c_kv[:, 5:] == 0).all()
    # Position 0 is not rotated (angle 0), later positions are: the cache keeps rotated keys.
    assert max_err(cache.k_rope[:, 0], k_rope[:, 0]) <= 1e-6
    assert max_err(cache.k_rope[:, 3], k_rope[:, 3]) > 1e-3
    # A rotation keeps the length of each channel pair (2i, 2i+1) (interleaved pairing).
    def pair_lengths(t):
        return t.view(*t.shape[:-1], 4, 2).norm(dim=-1)  # (B, T, D_r/2)
    assert max_err(pair_lengths(cache.k_rope[:, :5]), pair_lengths(k_rope)) <= 1e-5


# ---- (d) KV bytes per token, measured from the caches -----------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bytes_per_token_is_latent_plus_rope_key(dtype):
    mla = random_mla().to(dtype)
    cache = mla.new_cache(3)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    assert cache.bytes_per_token == (32 + 8) * itemsize
    assert cache.nbytes == 3 * 64 * (32 + 8) * itemsize


def test_mla_cache_is_far_smaller_than_mha_at_deepseek_v3_sizes():
    # DeepSeek-V3: 128 heads, d_c = 512, D_r = 64; an MHA of the same heads with D = 128.
    H, D, d_c, D_r = 128, 128, 512, 64
    mla = MLACache(1, 1, d_c, D_r, dtype=torch.bfloat16)
    mha = KVCache(n_layers=1, batch_size=1, n_kv_heads=H, max_seq_len=1, head_dim=D,
                  dtype=torch.bfloat16)
    assert mla.bytes_per_token == (d_c + D_r) * 2 == 1152
    assert mha.nbytes == 2 * H * D * 2 == 65536  # 2·H·D numbers, 2 bytes each
    assert math.isclose(mha.nbytes / mla.bytes_per_token, 2 * H * D / (d_c + D_r))  # ≈ 56.9×


# ---- (e) bad input gets a named ValueError ----------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (dict(qk_rope_head_dim=7), "even qk_rope_head_dim, got 7"),
    (dict(n_heads=0), "n_heads must be positive, got 0"),
    (dict(kv_lora_rank=-1), "kv_lora_rank must be positive, got -1"),
    (dict(q_lora_rank=0), "q_lora_rank must be positive, got 0"),
    (dict(rope_pairing="zigzag"), "rope_pairing must be one of"),
    (dict(rope_theta=1.0), "rope_theta must be > 1"),
])
def test_bad_config_raises(overrides, message):
    with pytest.raises(ValueError, match=message):
        MLAConfig(**{**SIZES, **overrides})


def test_bad_input_raises():
    mla = random_mla(max_seq_len=16)
    with pytest.raises(ValueError, match=r"x must have shape \(B, T, 64\), got \(2, 5, 32\)"):
        mla(torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match=r"0 cached \+ 17 new positions > max_seq_len \(16\)"):
        mla(torch.randn(1, 17, 64))
    cache = mla.new_cache(2)
    with pytest.raises(ValueError, match="cache was made for batch size 2, got x of batch size 3"):
        mla(torch.randn(3, 4, 64), cache)
    with torch.no_grad():
        mla(torch.randn(2, 10, 64), cache)
    with pytest.raises(ValueError, match=r"10 cached \+ 7 new positions > max_seq_len \(16\)"):
        mla(torch.randn(2, 7, 64), cache)
    assert cache.pos == 10  # a refused call leaves the cache as it was
    with pytest.raises(ValueError, match=r"max_seq_len must be in \[1, 16\].*got 17"):
        mla.new_cache(1, max_seq_len=17)
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        MLACache(0, 16, 32, 8)
    message = r"c_kv must have shape \(B, T, d_c\) = \(1, T, 32\) for this cache, got \(1, 2, 16\)"
    with pytest.raises(ValueError, match=message):
        MLACache(1, 16, 32, 8).update(torch.zeros(1, 2, 16), torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match=r"k_rope must have shape .* = \(1, 2, 8\) .* \(1, 2, 6\)"):
        MLACache(1, 16, 32, 8).update(torch.zeros(1, 2, 32), torch.zeros(1, 2, 6))
