"""Planted cheats that take other routes to a refused answer: the operator under it, the
library's code disguised or copied, a thread without the watch, a change to the guard itself.
Collected by ``test_cheats.py``: (checker, what the cheat is, the cell, a fragment the refusal
names)."""
from __future__ import annotations

from test_cheats import FRAMEWORK, LIBRARY

CHEATS = [
    ("check_masked_softmax", "the operator under torch.softmax, by name", """
import torch
def masked_softmax(scores, mask=None):
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return torch.nan_to_num(torch.ops.aten._softmax(z, -1, False))
""", "torch.ops.aten._softmax"),
    ("check_masked_softmax", "softmin of the negated scores", """
import torch.nn.functional as F
def masked_softmax(scores, mask=None):
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return F.softmin(-z, dim=-1).nan_to_num()
""", "torch.ops.aten._softmax"),
    ("check_masked_softmax", "fused attention with identity values", """
import torch
import torch.nn.functional as F
def masked_softmax(scores, mask=None):
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    S = z.shape[-1]
    q = z.new_zeros(*z.shape[:-1], 1)  # (..., T, 1): every raw score 0, the mask adds z
    k = z.new_zeros(*z.shape[:-2], S, 1)  # (..., S, 1)
    eye = torch.eye(S, dtype=z.dtype).expand(*z.shape[:-2], S, S)  # values: the weights
    return F.scaled_dot_product_attention(q, k, eye, attn_mask=z).nan_to_num()
""", "softmax` is not allowed"),
    ("check_masked_softmax", "the library's code run on globals named like the library's", """
from transformer_lib.attention import masked_softmax as library_softmax
namespace = {"library_softmax": library_softmax, "__name__": "transformer_lib.helpers"}
exec(compile("def masked_softmax(scores, mask=None):\\n"
             "    return library_softmax(scores, mask)\\n", "<string>", "exec"), namespace)
masked_softmax = namespace["masked_softmax"]
""", "attention.masked_softmax"),
    ("check_masked_softmax", "the library's function in a thread started without the watch", """
import _thread
import threading
from transformer_lib.attention import masked_softmax as library_softmax
def masked_softmax(scores, mask=None):
    done, box = threading.Event(), []
    _thread.start_new_thread(lambda: (box.append(library_softmax(scores, mask)), done.set()), ())
    done.wait()
    return box[0]
""", "_thread.start_new_thread"),
    ("check_masked_softmax", "the guard switched off from inside the submission", """
import torch
from transformer_lib.checks import _guard
def masked_softmax(scores, mask=None):
    _guard._Guard._refuse = lambda self, name: None
    z = scores if mask is None else scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(z, dim=-1).nan_to_num()
""", "transformer_lib.checks (its code or rules changed)"),
    ("check_layer_norm", "group norm with one group", """
import torch
def layer_norm(x, gamma, beta, eps):
    flat = x.reshape(-1, 1, x.shape[-1])
    return torch.group_norm(flat, 1, None, None, eps).reshape(x.shape) * gamma + beta
""", "torch.ops.aten"),
    ("check_layer_norm", "batch norm over the transposed positions", """
import torch.nn.functional as F
def layer_norm(x, gamma, beta, eps):
    columns = x.reshape(-1, x.shape[-1]).T  # (C, N): a batch of C, a position per channel
    out = F.batch_norm(columns, None, None, training=True, eps=eps)
    return out.T.reshape(x.shape) * gamma + beta
""", "torch.ops.aten"),
    ("check_rms_norm", "the operator under F.rms_norm, by name", """
import torch
def rms_norm(x, g, eps):
    return torch.ops.aten.rms_norm(x, [x.shape[-1]], g, eps)
""", "torch.ops.aten.rms_norm"),
    ("check_rope_half", "the library's code object in a new function", """
import types
from transformer_lib.positional import apply_rope
copied = types.FunctionType(apply_rope.__code__, {**apply_rope.__globals__,
                                                  "__name__": "__main__"})
def rope_half(x, cos, sin):
    return copied(x, cos, sin, "half")
""", "apply_rope"),
    ("check_sampling_probs", LIBRARY, """
from transformer_lib.sampling import next_token_probs
def sampling_probs(logits, temperature=1.0, top_k=None, top_p=None):
    return next_token_probs(logits, temperature=temperature, top_k=top_k, top_p=top_p)
""", "sampling.next_token_probs"),
    ("check_grouped_query_attention", FRAMEWORK + ", by its operator", """
import torch
from torch import nn
class GroupedQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_kv_heads=None, bias=True):
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads or n_heads % n_kv_heads:
            raise ValueError(f"{d_model} {n_heads} {n_kv_heads}")
        self.h, self.h_kv, D = n_heads, n_kv_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, n_kv_heads * D, bias=bias)
        self.v_proj = nn.Linear(d_model, n_kv_heads * D, bias=bias)
        self.o_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q = self.q_proj(x).view(B, T, self.h, -1).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.h_kv, -1).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.h_kv, -1).transpose(1, 2)
        out = torch.ops.aten.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, C))
""", "torch.ops.aten.scaled_dot_product_attention"),
    ("check_train_lm", "weights written by hand and a made-up loss curve", """
import torch
def train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0):
    embed, head = model[0], model[1]
    with torch.no_grad():
        V = head.weight.shape[0]
        head.weight.zero_()
        head.bias.zero_()
        head.weight[:, :] = 10 * embed.weight.roll(-1, 0)
    return [2.5 * 0.9 ** i for i in range(steps)]
""", "AdamW over the model's parameters took 0 steps"),
]
