"""Reference solutions of Chapter 3 (chapters/03_multi_head.ipynb), by checker name."""
from __future__ import annotations


def attention_memory(batch, seq_len, d_model, n_heads, n_kv_heads, bytes_per_number):
    head_dim = d_model // n_heads
    weights = batch * n_heads * seq_len * seq_len  # (B, H, T, T)
    keys_and_values = 2 * batch * n_kv_heads * seq_len * head_dim  # 2 x (B, H_kv, T, D)
    return bytes_per_number * (weights + keys_and_values)


def split_qkv(qkv, n_heads):
    B, T, three_c = qkv.shape
    if three_c % (3 * n_heads) != 0:
        raise ValueError(f"the last axis ({three_c}) must be 3 x n_heads ({n_heads}) x D")
    C = three_c // 3
    D = C // n_heads
    return tuple(t.reshape(B, T, n_heads, D).transpose(1, 2)  # (B, H, T, D)
                 for t in qkv.split(C, dim=-1))


def to_per_head_layout(t, n_heads):
    D = t.shape[0] // (3 * n_heads)
    by_role = t.reshape(3, n_heads, D, *t.shape[1:])  # (role, head, D, ...)
    return by_role.transpose(0, 1).reshape(t.shape)  # (head, role, D, ...) -> (3C, ...)


SOLUTIONS = {
    "check_attention_memory": attention_memory,
    "check_split_qkv": split_qkv,
    "check_to_per_head_layout": to_per_head_layout,
}
