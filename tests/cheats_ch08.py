"""Planted cheats for chapter 8's first core exercise (the tiled forward, keys a tile at a
time), collected by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the
refusal or the failed structure check names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

CHEATS = [
    ("check_tiled_attention", REFERENCE, """
from transformer_lib.checks import ch08_tiled_attention as c
def tiled_attention(q, k, v, block):
    return c._keys_in_tiles(q, k, v, block)
""", "ch08_tiled_attention._keys_in_tiles"),
    ("check_tiled_attention", LIBRARY, """
from transformer_lib.flash import flash_attention
def tiled_attention(q, k, v, block):
    return flash_attention(q, k, v, block_size=block)
""", "flash.flash_attention"),
    ("check_tiled_attention", "the library's loop with one tile of all the keys", """
from transformer_lib import flash
def tiled_attention(q, k, v, block):
    return flash.flash_attention(q, k, v, block_size=k.shape[-2])
""", "flash.flash_attention"),
    ("check_tiled_attention", "the library's attention entry", """
from transformer_lib.attention import tiled_attention as library_tiled
def tiled_attention(q, k, v, block):
    return library_tiled(q, k, v)
""", "attention.tiled_attention"),
    ("check_tiled_attention", PRIVATE, """
import transformer_lib.flash as fl
def tiled_attention(q, k, v, block):
    tiling = fl._tiling(q, k, None, False, block)
    return fl._forward(q, k, v, tiling, q.shape[-1] ** -0.5, 0.0)[0]
""", "flash._tiling"),
    ("check_tiled_attention", FRAMEWORK, """
import torch.nn.functional as F
def tiled_attention(q, k, v, block):
    return F.scaled_dot_product_attention(q, k, v)
""", "torch.nn.functional.scaled_dot_product_attention"),
    ("check_tiled_attention", "the framework's softmax on one tile of all the keys", """
def tiled_attention(q, k, v, block):
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    return scores.softmax(-1) @ v
""", "torch.Tensor.softmax"),
    ("check_tiled_attention", "full attention at once, softmax written out", """
import torch
def tiled_attention(q, k, v, block):
    scores = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5  # (..., T, S)
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)) @ v
""", "more than one tile of 8 keys"),
    ("check_tiled_attention", "the online loop run with block = S", """
import torch
def tiled_attention(q, k, v, block):
    block = k.shape[-2]  # one tile: the whole row
    m = torch.full((*q.shape[:-1], 1), float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    a = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for start in range(0, k.shape[-2], block):
        s = (q @ k[..., start:start + block, :].transpose(-2, -1)) / q.shape[-1] ** 0.5
        new = torch.maximum(m, s.amax(-1, keepdim=True))
        e = torch.exp(s - new)
        l = torch.exp(m - new) * l + e.sum(-1, keepdim=True)
        a = torch.exp(m - new) * a + e @ v[..., start:start + block, :]
        m = new
    return a / l
""", "more than one tile of 8 keys"),
    ("check_tiled_attention", CHECKER, """
from transformer_lib.checks import check_tiled_attention
def tiled_attention(q, k, v, block):
    check_tiled_attention(lambda q, k, v, block: q)
    return q
""", "check_tiled_attention"),
]
