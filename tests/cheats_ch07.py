"""Planted cheats for chapter 7's core exercises (the write into a preallocated cache, a cached
attention step, the sampling distribution), collected by ``test_cheats.py``: (checker, what
the cheat is, the cell, a fragment the refusal names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

CHEATS = [
    # write_kv ---------------------------------------------------------------------------------
    ("check_write_kv", REFERENCE, """
from transformer_lib.checks import ch07_cached_attention as c
def write_kv(k_cache, v_cache, k_new, v_new, position):
    end = position + k_new.shape[2]
    k_cache.copy_(c._written(k_cache, k_new, position))
    v_cache.copy_(c._written(v_cache, v_new, position))
    return k_cache[:, :, :end], v_cache[:, :, :end]
""", "ch07_cached_attention._written"),
    ("check_write_kv", LIBRARY, """
from transformer_lib.cache import KVCache
def write_kv(k_cache, v_cache, k_new, v_new, position):
    B, H_kv, S_max, D = k_cache.shape
    cache = KVCache(1, B, H_kv, S_max, D)
    cache.k[0], cache.v[0], cache.pos = k_cache, v_cache, position
    return cache.update(0, k_new, v_new)
""", "cache.KVCache"),
    ("check_write_kv", "the library cache's update, on a cache made without its constructor", """
from transformer_lib.cache import KVCache
def write_kv(k_cache, v_cache, k_new, v_new, position):
    cache = KVCache.__new__(KVCache)
    cache.k, cache.v = k_cache[None], v_cache[None]
    cache.pos, cache.max_seq_len = position, k_cache.shape[2]
    return KVCache.update(cache, 0, k_new, v_new)
""", "cache.KVCache.update"),
    ("check_write_kv", PRIVATE, """
from transformer_lib import attention
def write_kv(k_cache, v_cache, k_new, v_new, position):
    attention._heads_per_kv_head(k_new, k_cache, v_cache)
    end = position + k_new.shape[2]
    k_cache[:, :, position:end], v_cache[:, :, position:end] = k_new, v_new
    return k_cache[:, :, :end], v_cache[:, :, :end]
""", "attention._heads_per_kv_head"),
    ("check_write_kv", CHECKER, """
from transformer_lib.checks import check_write_kv
def write_kv(k_cache, v_cache, k_new, v_new, position):
    check_write_kv(lambda *args: args[:2])
    end = position + k_new.shape[2]
    k_cache[:, :, position:end], v_cache[:, :, position:end] = k_new, v_new
    return k_cache[:, :, :end], v_cache[:, :, :end]
""", "check_write_kv"),
    # cached_forward ---------------------------------------------------------------------------
    ("check_cached_forward", REFERENCE, """
from transformer_lib.checks import ch07_cached_attention as c
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    out, keys, values = c._cached_step(attn, x, k_cache, v_cache, position)
    k_cache.copy_(keys)
    v_cache.copy_(values)
    return out
""", "ch07_cached_attention._cached_step"),
    ("check_cached_forward", "the layer with its own kv_cache argument", """
class Slots:  # the one method the layer calls on a cache
    def __init__(self, k, v, pos):
        self.k, self.v, self.pos = k, v, pos

    def update(self, layer_idx, k, v):
        end = self.pos + k.shape[2]
        self.k[:, :, self.pos:end], self.v[:, :, self.pos:end] = k, v
        return self.k[:, :, :end], self.v[:, :, :end]

def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    rope = cos[position:position + x.shape[1]], sin[position:position + x.shape[1]]
    return attn(x, rope=rope, kv_cache=Slots(k_cache, v_cache, position), causal=True)
""", "attention.MultiHeadAttention.forward"),
    ("check_cached_forward", "the layer with the library's KVCache", """
from transformer_lib.cache import KVCache
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    B, H_kv, S_max, D = k_cache.shape
    cache = KVCache(1, B, H_kv, S_max, D)
    cache.k[0], cache.v[0], cache.pos = k_cache, v_cache, position
    rope = cos[position:position + x.shape[1]], sin[position:position + x.shape[1]]
    out = attn(x, rope=rope, kv_cache=cache, causal=True)
    k_cache.copy_(cache.k[0])
    v_cache.copy_(cache.v[0])
    return out
""", "cache.KVCache"),
    ("check_cached_forward", LIBRARY, """
from transformer_lib.attention import eager_attention
from transformer_lib.positional import apply_rope
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    B, T, C = x.shape
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    rows = cos[position:position + T], sin[position:position + T]
    q = apply_rope(attn.q_proj(x).view(B, T, H, D).transpose(1, 2), *rows)
    k = apply_rope(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2), *rows)
    k_cache[:, :, position:position + T] = k
    v_cache[:, :, position:position + T] = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    end = position + T
    out, _ = eager_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], causal=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))
""", "attention.eager_attention"),
    ("check_cached_forward", "the library's repeat_kv", """
from transformer_lib.attention import repeat_kv
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    repeat_kv(k_cache, attn.n_heads // attn.n_kv_heads)
    return x
""", "attention.repeat_kv"),
    ("check_cached_forward", PRIVATE, """
from transformer_lib import attention
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    attention._heads_per_kv_head(k_cache, k_cache, v_cache)
    return x
""", "attention._heads_per_kv_head"),
    ("check_cached_forward", FRAMEWORK, """
import torch.nn.functional as F
from transformer_lib.positional import apply_rope
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    B, T, C = x.shape
    H, H_kv, D = attn.n_heads, attn.n_kv_heads, attn.head_dim
    rows = cos[position:position + T], sin[position:position + T]
    q = apply_rope(attn.q_proj(x).view(B, T, H, D).transpose(1, 2), *rows)
    k = apply_rope(attn.k_proj(x).view(B, T, H_kv, D).transpose(1, 2), *rows)
    k_cache[:, :, position:position + T] = k
    v_cache[:, :, position:position + T] = attn.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)
    end = position + T
    out = F.scaled_dot_product_attention(q, k_cache[:, :, :end], v_cache[:, :, :end],
                                         enable_gqa=True)
    return attn.o_proj(out.transpose(1, 2).reshape(B, T, C))
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_cached_forward", "the framework's attention module", """
import torch
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    layer = torch.nn.MultiheadAttention(x.shape[-1], attn.n_heads, batch_first=True)
    return x
""", "torch.nn.MultiheadAttention"),
    ("check_cached_forward", CHECKER, """
from transformer_lib.checks import check_cached_forward
def cached_forward(attn, x, k_cache, v_cache, position, cos, sin):
    check_cached_forward(lambda *args: args[1])
    return x
""", "check_cached_forward"),
    # sampling_probs ---------------------------------------------------------------------------
    ("check_sampling_probs", REFERENCE, """
from transformer_lib.checks import ch07_sampling as c
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    return c._sampling(logits, temperature, top_k, top_p)
""", "ch07_sampling._sampling"),
    ("check_sampling_probs", LIBRARY, """
from transformer_lib.sampling import next_token_probs
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    probs = next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    return probs.to(logits.dtype)
""", "sampling.next_token_probs"),
    ("check_sampling_probs", "the library's sampler, its draws counted", """
import torch
from transformer_lib.sampling import sample_next_token
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    draws = torch.cat([sample_next_token(logits, temperature=temperature, top_k=top_k,
                                         top_p=top_p) for _ in range(2000)], dim=1)
    ones = torch.ones_like(draws, dtype=logits.dtype)
    counts = torch.zeros_like(logits).scatter_add(-1, draws, ones)
    return counts / counts.sum(-1, keepdim=True)
""", "sampling.sample_next_token"),
    ("check_sampling_probs", "the library's check of the arguments", """
import torch
from transformer_lib.sampling import check_sampling
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    check_sampling(temperature, top_k, top_p, logits.shape[-1])
    return torch.softmax(logits / temperature, dim=-1)
""", "sampling.check_sampling"),
    ("check_sampling_probs", PRIVATE, """
import torch
from transformer_lib import sampling
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    sampling._check_logits(logits)
    return torch.softmax(logits / temperature, dim=-1)
""", "sampling._check_logits"),
    ("check_sampling_probs", CHECKER, """
import torch
from transformer_lib.checks import check_sampling_probs
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    check_sampling_probs(lambda *args: args[0])
    return torch.softmax(logits / temperature, dim=-1)
""", "check_sampling_probs"),
]
