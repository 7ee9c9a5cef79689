"""Planted cheats for chapter 4's core exercises (LayerNorm and RMSNorm as functions, and the
2017 training step),
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
    ("check_training_step", REFERENCE, """
from transformer_lib.checks import ch04_training_step as c
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    loss = c._smoothed_loss(model(src, tgt_in), tgt_out, smoothing)
    return loss.item()
""", "ch04_training_step._smoothed_loss"),
    ("check_training_step", LIBRARY, """
import torch
from transformer_lib.encoder_decoder import LabelSmoothingLoss, noam_lambda
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    loss = LabelSmoothingLoss(smoothing)(model(src, tgt_in), tgt_out)
    rate = noam_lambda(model.config.d_model, warmup)
    model.zero_grad()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= lr_scale * rate(state.get("t", 0)) * p.grad.sign()
    state["t"] = state.get("t", 0) + 1
    return loss.item()
""", "LabelSmoothingLoss"),
    ("check_training_step", PRIVATE, """
from transformer_lib import stability
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    run = stability._one_run(model.config, depth=1, norm="post", schedule="noam", seed=0,
                             every=1, eval_n=1, steps=1, warmup=warmup)
    return run["final_loss"]
""", "stability._one_run"),
    ("check_training_step", FRAMEWORK, """
import torch
from transformer_lib.encoder_decoder import LabelSmoothingLoss
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    if not state:
        d = model.config.d_model
        state["opt"] = torch.optim.Adam(model.parameters(), lr=lr_scale, betas=betas, eps=eps)
        state["lr"] = torch.optim.lr_scheduler.LambdaLR(
            state["opt"], lambda t: d ** -0.5 * min(max(t, 1) ** -0.5,
                                                    max(t, 1) * warmup ** -1.5))
    logits = model(src, tgt_in)
    log_p = torch.log_softmax(logits, dim=-1).flatten(0, 1)
    labels = tgt_out.flatten()
    kept = labels != -100
    nll = -log_p[kept].gather(1, labels[kept][:, None]).squeeze(1)
    loss = ((1 - smoothing) * nll - smoothing * log_p[kept].mean(-1)).mean()
    state["opt"].zero_grad()
    loss.backward()
    state["opt"].step()
    state["lr"].step()
    return loss.item()
""", "torch.optim.adam.Adam"),
    ("check_training_step", "the framework's smoothed cross-entropy", """
import torch
import torch.nn.functional as F
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    logits = model(src, tgt_in)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(),
                           label_smoothing=smoothing, ignore_index=-100)
    model.zero_grad()
    loss.backward()
    return loss.item()
""", "torch.nn.functional.cross_entropy"),
    ("check_training_step", CHECKER, """
from transformer_lib.checks import check_training_step
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    check_training_step(lambda *a, **k: 0.0)
    return 0.0
""", "check_training_step"),
    ("check_training_step", "the library's training loop", """
from transformer_lib.tasks import train_reversal
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    trained, history = train_reversal(model.config, steps=1, warmup=warmup,
                                      lr_scale=lr_scale, smoothing=smoothing)
    model.load_state_dict(trained.state_dict())
    return history["loss"][0]
""", "tasks.train_reversal"),
    ("check_training_step", "the library's Noam factor", """
import torch
from transformer_lib.tasks import noam_lambda
def training_step(model, src, tgt_in, tgt_out, state, *, warmup, lr_scale=1.0, smoothing=0.1,
                  betas=(0.9, 0.98), eps=1e-9):
    t = state.get("t", 0)
    rate = lr_scale * noam_lambda(model.config.d_model, warmup)(t)
    return rate
""", "noam_lambda"),
]
