"""Planted cheats for chapter 4's core exercises (LayerNorm and RMSNorm as functions),
collected by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal
names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

CHEATS = [
    ("check_layer_norm", REFERENCE, """
from transformer_lib.checks import ch04_norms
def layer_norm(x, gamma, beta, eps=1e-5):
    return ch04_norms._layer_norm(x, gamma, beta, eps)
""", "ch04_norms._layer_norm"),
    ("check_layer_norm", LIBRARY, """
from transformer_lib.norms import layer_norm as library_layer_norm
def layer_norm(x, gamma, beta, eps=1e-5):
    return library_layer_norm(x, gamma, beta, eps)
""", "norms.layer_norm"),
    ("check_layer_norm", "the library's module", """
import torch
from transformer_lib.norms import LayerNorm
def layer_norm(x, gamma, beta, eps=1e-5):
    norm = LayerNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(gamma)
        norm.bias.copy_(beta)
    return norm(x)
""", "norms.LayerNorm"),
    ("check_layer_norm", PRIVATE, """
from transformer_lib import norms
def layer_norm(x, gamma, beta, eps=1e-5):
    norms._check_sizes(x.shape[-1], eps)
    return x
""", "norms._check_sizes"),
    ("check_layer_norm", FRAMEWORK, """
import torch.nn.functional as F
def layer_norm(x, gamma, beta, eps=1e-5):
    return F.layer_norm(x.float(), x.shape[-1:], gamma.float(), beta.float(), eps).to(x.dtype)
""", "torch.nn.functional.layer_norm"),
    ("check_layer_norm", "the framework's module", """
import torch
def layer_norm(x, gamma, beta, eps=1e-5):
    return torch.nn.LayerNorm(x.shape[-1], eps=eps)(x)
""", "torch.nn.LayerNorm"),
    ("check_layer_norm", CHECKER, """
from transformer_lib.checks import check_layer_norm
def layer_norm(x, gamma, beta, eps=1e-5):
    check_layer_norm(lambda *a: a[0])
    return x
""", "check_layer_norm"),
    ("check_rms_norm", REFERENCE, """
from transformer_lib.checks import ch04_norms
def rms_norm(x, g, eps=1e-6):
    return ch04_norms._rms_norm(x, g, eps)
""", "ch04_norms._rms_norm"),
    ("check_rms_norm", LIBRARY, """
from transformer_lib import norms
def rms_norm(x, g, eps=1e-6):
    return norms.rms_norm(x, g, eps)
""", "norms.rms_norm"),
    ("check_rms_norm", "the library's module", """
import torch
from transformer_lib.norms import RMSNorm
def rms_norm(x, g, eps=1e-6):
    norm = RMSNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        norm.weight.copy_(g)
    return norm(x)
""", "norms.RMSNorm"),
    ("check_rms_norm", PRIVATE, """
import transformer_lib.norms as N
def rms_norm(x, g, eps=1e-6):
    getattr(N, "_check_sizes")(x.shape[-1], eps)
    return x
""", "norms._check_sizes"),
    ("check_rms_norm", FRAMEWORK, """
import torch
def rms_norm(x, g, eps=1e-6):
    return torch.rms_norm(x.float(), x.shape[-1:], g.float(), eps).to(x.dtype)
""", "torch.rms_norm"),
    ("check_rms_norm", "the framework's functional form", """
import math
import torch.nn.functional as F
def rms_norm(x, g, eps=1e-6):
    h = x.float()
    return (F.normalize(h, dim=-1) * math.sqrt(h.shape[-1]) * g.float()).to(x.dtype)
""", "torch.nn.functional.normalize"),
    ("check_rms_norm", CHECKER, """
from transformer_lib.checks import check_rms_norm
def rms_norm(x, g, eps=1e-6):
    check_rms_norm(lambda *a: a[0])
    return x
""", "check_rms_norm"),
]
