"""Planted cheats for chapter 5's core exercises (RoPE in its two pairings), collected by
``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

CHEATS = []
for _name, _pairing in (("rope_half", "half"), ("rope_interleaved", "interleaved")):
    _checker = f"check_{_name}"
    CHEATS += [
        (_checker, REFERENCE, f"""
from transformer_lib.checks import ch05_rope
def {_name}(x, cos, sin):
    return ch05_rope._rotate(x, cos, sin, "{_pairing}")
""", "ch05_rope._rotate"),
        (_checker, LIBRARY, f"""
from transformer_lib.positional import apply_rope
def {_name}(x, cos, sin):
    return apply_rope(x, cos, sin, pairing="{_pairing}")
""", "positional.apply_rope"),
        (_checker, PRIVATE, f"""
from transformer_lib import positional
def {_name}(x, cos, sin):
    w = positional._permute_rows(x.reshape(-1, x.shape[-1]).T, 1, (0, 1))
    return x
""", "positional._permute_rows"),
        (_checker, FRAMEWORK, f"""
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
def {_name}(x, cos, sin):
    full_cos, full_sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    return apply_rotary_pos_emb(x, x, full_cos, full_sin, unsqueeze_dim=0)[0]
""", "transformers."),
        (_checker, CHECKER, f"""
from transformer_lib.checks import {_checker}
def {_name}(x, cos, sin):
    {_checker}(lambda *a: a[0])
    return x
""", _checker),
    ]
