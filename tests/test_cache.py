"""The KV cache (claim C33): what a layer writes, where, and what it reads back."""
import pytest
import torch

from conftest import randomize_
from transformer_lib.attention import MultiHeadAttention, causal_mask
from transformer_lib.cache import KVCache
from transformer_lib.decoder import KVCache as KVCacheFromDecoder


def test_update_writes_at_pos_and_returns_everything_cached():
    cache = KVCache(n_layers=2, batch_size=1, n_kv_heads=2, max_seq_len=8, head_dim=3)
    k1, v1 = torch.randn(1, 2, 5, 3), torch.randn(1, 2, 5, 3)  # (B, H_kv, T, D)
    k, v = cache.update(1, k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1)
    assert cache.pos == 0, "update does not advance: the model does, once per forward"
    assert (cache.k[0] == 0).all(), "layer 0's slot is untouched"
    cache.advance(5)
    k2, v2 = torch.randn(1, 2, 2, 3), torch.randn(1, 2, 2, 3)
    k, v = cache.update(1, k2, v2)
    assert torch.equal(k, torch.cat([k1, k2], dim=2)) and torch.equal(v, torch.cat([v1, v2], dim=2))
    cache.reset()
    assert cache.pos == 0


def test_layer_writes_into_the_slot_of_its_layer_idx():
    """A layer knows its place from construction: with a cache it attends to every cached
    position, exactly as a full forward over the whole sequence does."""
    torch.manual_seed(0)
    attn = randomize_(MultiHeadAttention(16, 4, n_kv_heads=2, layer_idx=2)).eval()
    x = torch.randn(1, 7, 16)  # (B, T, C)
    full = attn(x, mask=causal_mask(7))  # (B, T, C)
    cache = KVCache(n_layers=3, batch_size=1, n_kv_heads=2, max_seq_len=10, head_dim=4)
    first = attn(x[:, :4], mask=causal_mask(4), kv_cache=cache)
    cache.advance(4)
    rest = attn(x[:, 4:], mask=causal_mask(3, 7), kv_cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), full, atol=1e-6, rtol=0)
    assert (cache.k[:2] == 0).all() and (cache.k[2, :, :, :7] != 0).all()


def test_decoder_module_still_exports_the_cache():
    assert KVCacheFromDecoder is KVCache


def test_bad_cache_use_is_rejected():
    with pytest.raises(ValueError, match=r"batch_size=0, head_dim=0"):
        KVCache(n_layers=1, batch_size=0, n_kv_heads=1, max_seq_len=4, head_dim=0)
    cache = KVCache(n_layers=2, batch_size=1, n_kv_heads=1, max_seq_len=4, head_dim=2)
    with pytest.raises(ValueError, match=r"layer_idx must be in \[0, 1\], got 2"):
        cache.update(2, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))
    with pytest.raises(ValueError, match=r"0 cached \+ 5 new positions > max_seq_len \(4\)"):
        cache.update(0, torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))
    with pytest.raises(ValueError, match=r"layer_idx must be >= 0, got -1"):
        MultiHeadAttention(8, 2, layer_idx=-1)
