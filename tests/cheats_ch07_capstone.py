"""Planted cheats for the capstone's exercises (the model from the student's pieces, the
training loop), collected by ``test_cheats.py``: (checker, what the cheat is, the cell, a
fragment the refusal names)."""
from __future__ import annotations

from test_cheats import CHECKER, FRAMEWORK, LIBRARY, PRIVATE, REFERENCE

# A model that holds the decoder's weights under the library's names and leaves the forward
# pass to FORWARD, which each cheat below fills in.
_MODEL = '''
import torch
from torch import nn
import torch.nn.functional as F

class CapstoneLM(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        C, kv = config.d_model, config.n_kv_heads * (config.d_model // config.n_heads)
        def norm():
            holder = nn.Module()
            holder.weight = nn.Parameter(torch.ones(C))
            return holder
        self.embed_tokens = nn.Embedding(config.vocab_size, C)
        self.layers = nn.ModuleList()
        for _ in range(config.n_layers):
            block, attn, mlp = nn.Module(), nn.Module(), nn.Module()
            attn.q_proj, attn.o_proj = nn.Linear(C, C, bias=False), nn.Linear(C, C, bias=False)
            attn.k_proj, attn.v_proj = nn.Linear(C, kv, bias=False), nn.Linear(C, kv, bias=False)
            mlp.gate_proj = nn.Linear(C, config.d_ff, bias=False)
            mlp.up_proj = nn.Linear(C, config.d_ff, bias=False)
            mlp.down_proj = nn.Linear(config.d_ff, C, bias=False)
            block.input_layernorm, block.post_attention_layernorm = norm(), norm()
            block.self_attn, block.mlp = attn, mlp
            self.layers.append(block)
        self.norm = norm()
        self.lm_head = nn.Linear(C, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def weights(self):
        return dict(self.named_parameters(remove_duplicate=False))

    def forward(self, tokens):
FORWARD
'''


def _model(forward: str) -> str:
    body = "\n".join("        " + line for line in forward.strip("\n").split("\n"))
    return _MODEL.replace("FORWARD", body)


CHEATS = [
    # CapstoneLM -------------------------------------------------------------------------------
    ("check_capstone_lm", REFERENCE, _model("""
from transformer_lib.checks import ch07_capstone
return ch07_capstone._logits(tokens, self.weights(), self.config).to(tokens.device).float()
"""), "ch07_capstone._logits"),
    ("check_capstone_lm", LIBRARY, """
from transformer_lib.decoder import Decoder
class CapstoneLM(Decoder):
    pass
""", "decoder.Decoder"),
    ("check_capstone_lm", "the library's Decoder run on the model's own weights", _model("""
from transformer_lib.decoder import Decoder
with torch.device("meta"):
    twin = Decoder(self.config)
twin.load_state_dict(self.weights(), assign=True)
return twin(tokens)
"""), "decoder.Decoder"),
    ("check_capstone_lm", "the library's functional pieces", _model("""
from transformer_lib.norms import rms_norm
w = self.weights()
x = w["embed_tokens.weight"][tokens]
return rms_norm(x, w["norm.weight"], self.config.norm_eps) @ w["lm_head.weight"].T
"""), "norms.rms_norm"),
    ("check_capstone_lm", PRIVATE, _model("""
from transformer_lib import attention
attention._heads_per_kv_head(torch.zeros(1, 2, 1, 4), torch.zeros(1, 1, 1, 4),
                             torch.zeros(1, 1, 1, 4))
return self.weights()["embed_tokens.weight"][tokens] @ self.lm_head.weight.T
"""), "attention._heads_per_kv_head"),
    ("check_capstone_lm", FRAMEWORK, _model("""
w, c = self.weights(), self.config
x = w["embed_tokens.weight"][tokens]
B, T, C = x.shape
q = (x @ w["layers.0.self_attn.q_proj.weight"].T).view(B, T, c.n_heads, -1).transpose(1, 2)
F.scaled_dot_product_attention(q, q, q, is_causal=True)
return x @ w["lm_head.weight"].T
"""), "scaled_dot_product_attention"),
    ("check_capstone_lm", CHECKER, _model("""
from transformer_lib.checks import check_train_lm
check_train_lm(lambda *args: [0.0])
return self.weights()["embed_tokens.weight"][tokens] @ self.lm_head.weight.T
"""), "check_train_lm"),
    # train_lm ---------------------------------------------------------------------------------
    ("check_train_lm", LIBRARY, """
from transformer_lib.text import next_token_batch
import torch
import torch.nn.functional as F
def train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0):
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        inputs, targets = next_token_batch(ids, batch_size, seq_len, generator)
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
""", "text.next_token_batch"),
    ("check_train_lm", PRIVATE, """
from transformer_lib import text
def train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0):
    return [text._lr_at(step, steps, lr, 0, lr) for step in range(steps)]
""", "text._lr_at"),
    ("check_train_lm", REFERENCE, """
from transformer_lib.checks import ch07_capstone
def train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0):
    ch07_capstone._bigram_model(12, seed)
    return [0.0] * steps
""", "ch07_capstone._bigram_model"),
    ("check_train_lm", CHECKER, """
from transformer_lib.checks import check_capstone_lm
def train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0):
    check_capstone_lm(object)
    return [0.0] * steps
""", "check_capstone_lm"),
]
