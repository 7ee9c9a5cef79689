"""Planted cheats for chapter 1's core exercises (the masked softmax and attention), collected
by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

CHEATS = [
    ("check_masked_softmax", REFERENCE, """
from transformer_lib.checks import ch01_softmax_attention as c
def masked_softmax(scores, mask=None):
    return c._softmax(scores, mask)
""", "ch01_softmax_attention._softmax"),
    ("check_masked_softmax", LIBRARY, """
from transformer_lib.attention import masked_softmax as library_softmax
def masked_softmax(scores, mask=None):
    return library_softmax(scores, mask)
""", "attention.masked_softmax"),
    ("check_masked_softmax", PRIVATE, """
import torch
from transformer_lib import attention
def masked_softmax(scores, mask=None):
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    e = (z - z.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)).exp()
    q = e[..., None, :]
    attention._heads_per_kv_head(q, q, q)
    return e / e.sum(-1, keepdim=True).clamp_min(1e-30)
""", "attention._heads_per_kv_head"),
    ("check_masked_softmax", FRAMEWORK, """
import torch
def masked_softmax(scores, mask=None):
    z = scores.float() if mask is None else scores.float().masked_fill(~mask, float("-inf"))
    return torch.softmax(z, dim=-1).nan_to_num(0.0).to(scores.dtype)
""", "torch.softmax"),
    ("check_masked_softmax", "the framework's answer as a method", """
def masked_softmax(scores, mask=None):
    z = scores.float() if mask is None else scores.float().masked_fill(~mask, float("-inf"))
    return z.log_softmax(-1).exp().nan_to_num(0.0).to(scores.dtype)
""", "torch.Tensor.log_softmax"),
    ("check_masked_softmax", CHECKER, """
from transformer_lib.checks import check_masked_softmax
def masked_softmax(scores, mask=None):
    check_masked_softmax(lambda s, m=None: s)
    return scores
""", "check_masked_softmax"),
    ("check_attention", REFERENCE, """
from transformer_lib.checks import ch01_softmax_attention as c
def attention(q, k, v, mask=None):
    return c._attention(q, k, v, mask)
""", "ch01_softmax_attention._attention"),
    ("check_attention", LIBRARY, """
from transformer_lib.attention import scaled_dot_product_attention
def attention(q, k, v, mask=None):
    return scaled_dot_product_attention(q, k, v, mask)
""", "attention.scaled_dot_product_attention"),
    ("check_attention", "the library's softmax inside the student's attention", """
import math
from transformer_lib.attention import masked_softmax
def attention(q, k, v, mask=None):
    weights = masked_softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), mask)
    return weights @ v, weights
""", "attention.masked_softmax"),
    ("check_attention", PRIVATE, """
import math
from transformer_lib import attention as A
def attention(q, k, v, mask=None):
    A._heads_per_kv_head(q, k, v)
    return q, q
""", "attention._heads_per_kv_head"),
    ("check_attention", FRAMEWORK, """
import torch
import torch.nn.functional as F
def attention(q, k, v, mask=None):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out, out
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_attention", "the framework's attention module", """
import torch
def attention(q, k, v, mask=None):
    layer = torch.nn.MultiheadAttention(q.shape[-1], 1)
    return q, q
""", "torch.nn.MultiheadAttention"),
]
