"""Planted cheats for chapter 3's core exercise (the layer ``GroupedQueryAttention``), collected
by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal names).

The exercise asks for a class, so besides the calls the guard refuses there are the cheats that
need no call of the student's own: a class built on the library's layer (its inherited methods
are the library's code) and a class that keeps such a layer, made before the check."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

# The honest layer's constructor, which the cheats below share.
_INIT = """
import torch
from torch import nn

class Base(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"{d_model} {n_heads} {n_kv_heads}")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        kv = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, kv, bias=bias)
        self.v_proj = nn.Linear(d_model, kv, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)

    def heads(self, x):
        B, T, C = x.shape
        D = self.head_dim
        q = self.q_proj(x).view(B, T, -1, D).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, D).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, D).transpose(1, 2)
        return q, k, v
"""

CHEATS = [
    ("check_grouped_query_attention", REFERENCE, _INIT + """
from transformer_lib.checks import ch03_attention_layer as c

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        state = {k: t.detach() for k, t in self.state_dict().items()}
        return c._gqa(x, state, self.n_heads, self.n_kv_heads, mask)
""", "ch03_attention_layer._gqa"),
    ("check_grouped_query_attention", LIBRARY, """
from transformer_lib.attention import MultiHeadAttention

class GroupedQueryAttention(MultiHeadAttention):
    def forward(self, x, mask=None):
        return super().forward(x, mask=mask)
""", "built on `transformer_lib.attention.MultiHeadAttention`"),
    ("check_grouped_query_attention", "the library's layer, kept inside", """
from torch import nn
from transformer_lib.attention import MultiHeadAttention

class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        self.inner = MultiHeadAttention(d_model, n_heads, n_kv_heads, bias=bias)

    def forward(self, x, mask=None):
        return self.inner(x, mask=mask)
""", "attention.MultiHeadAttention"),
    ("check_grouped_query_attention", "the library's layer, made before the check", """
import copy
from torch import nn
from transformer_lib.attention import MultiHeadAttention

LAYERS = {(C, H, K, b): MultiHeadAttention(C, H, K, bias=b) for C, H, K, b in
          [(16, 4, 4, True), (16, 4, 1, True), (24, 6, 2, True), (32, 8, 2, False),
           (16, 4, 2, True)]}

class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        layer = LAYERS[d_model, n_heads, n_kv_heads or n_heads, bias]
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, copy.deepcopy(getattr(layer, name)))
        self.__dict__["run"] = layer.forward

    def forward(self, x, mask=None):
        return self.run(x, mask=mask)
""", "keeps the library's `transformer_lib.attention.MultiHeadAttention.forward`"),
    ("check_grouped_query_attention", "the library's forward as the class's own", _INIT + """
from transformer_lib.attention import MultiHeadAttention

class GroupedQueryAttention(Base):
    forward = MultiHeadAttention.forward
""", "keeps the library's `transformer_lib.attention.MultiHeadAttention.forward`"),
    ("check_grouped_query_attention", PRIVATE, _INIT + """
from transformer_lib import attention

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        q, k, v = self.heads(x)
        attention._heads_per_kv_head(q, k, v)
        return x
""", "attention._heads_per_kv_head"),
    ("check_grouped_query_attention", "the library's repeat_kv", _INIT + """
from transformer_lib.attention import repeat_kv

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        q, k, v = self.heads(x)
        k = repeat_kv(k, self.n_heads // self.n_kv_heads)
        return x
""", "attention.repeat_kv"),
    ("check_grouped_query_attention", "the library's attention function", _INIT + """
from transformer_lib.attention import eager_attention

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.heads(x)
        out, _ = eager_attention(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))
""", "attention.eager_attention"),
    ("check_grouped_query_attention", FRAMEWORK, _INIT + """
import torch.nn.functional as F

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.heads(x)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_grouped_query_attention", "the framework's attention layer", _INIT + """
class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        layer = nn.MultiheadAttention(x.shape[-1], self.n_heads, batch_first=True)
        return x
""", "torch.nn.MultiheadAttention"),
    ("check_grouped_query_attention", "built on the framework's attention layer", """
from torch import nn

class GroupedQueryAttention(nn.MultiheadAttention):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__(d_model, n_heads, bias=bias, batch_first=True)
""", "built on `torch.nn.MultiheadAttention`"),
    ("check_grouped_query_attention", "the framework's attention function", _INIT + """
import torch.nn.functional as F

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        return F.multi_head_attention_forward(x, x, x, x.shape[-1], self.n_heads, None, None,
                                              None, None, False, 0.0, self.o_proj.weight,
                                              self.o_proj.bias)[0]
""", "torch.nn.functional.multi_head_attention_forward"),
    ("check_grouped_query_attention", CHECKER, _INIT + """
from transformer_lib.checks import check_grouped_query_attention

class GroupedQueryAttention(Base):
    def forward(self, x, mask=None):
        check_grouped_query_attention(Base)
        return x
""", "check_grouped_query_attention"),
]
