"""Reference solutions of the setup chapter (chapters/00_setup.ipynb), by checker name."""
from __future__ import annotations


def mha_shapes(B, T, S, C, H, H_kv):
    D = C // H
    return (B, T, C), (B, H, T, S), (H_kv * D, C)


SOLUTIONS = {
    "check_mha_shapes": mha_shapes,
}
