"""Checkers for the capstone (``chapters/07d_capstone.ipynb``): the student's own pieces
assembled into a decoder-only language model, and the loop that trains it.

While the student's model is built, run and trained here, the whole library is refused
(nothing is listed in ``allow`` but the config the model is built from), so a model that
passes computes its logits with the student's own functions. The reference below is a float64
decoder written out from the weights, independently of the library; a test proves it equal to
:class:`~transformer_lib.decoder.Decoder`."""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from transformer_lib.checks._guard import Rules, given
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say
from transformer_lib.checks.ch03_attention_layer import _held

# The framework's ready-made pieces of a decoder: its attention, its norm and its layers.
_FRAMEWORK_DECODER = (
    "torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention",
    "torch.nn.functional.multi_head_attention_forward", "torch.nn.functional.rms_norm",
    "torch.nn.TransformerDecoderLayer", "torch.nn.TransformerEncoderLayer",
    "torch.nn.Transformer", "transformers.*")

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "CapstoneLM": Rules(allow=("DecoderConfig",), refuse=_FRAMEWORK_DECODER),
    "train_lm": Rules(refuse=_FRAMEWORK_DECODER),
}

_BLOCK = ("input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight")


# The reference ----------------------------------------------------------------------------------


def _shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """The names and shapes of every tensor of a decoder with these sizes, as
    ``Decoder(config).state_dict()`` has them (tied weights appear under both names)."""
    V, C, F_ = config.vocab_size, config.d_model, config.d_ff
    kv = config.n_kv_heads * (C // config.n_heads)  # H_kv * D
    block = {"input_layernorm.weight": (C,), "self_attn.q_proj.weight": (C, C),
             "self_attn.k_proj.weight": (kv, C), "self_attn.v_proj.weight": (kv, C),
             "self_attn.o_proj.weight": (C, C), "post_attention_layernorm.weight": (C,),
             "mlp.gate_proj.weight": (F_, C), "mlp.up_proj.weight": (F_, C),
             "mlp.down_proj.weight": (C, F_)}
    shapes = {"embed_tokens.weight": (V, C)}
    for i in range(config.n_layers):
        shapes.update({"layers." + str(i) + "." + key: shape for key, shape in block.items()})
    shapes.update({"norm.weight": (C,), "lm_head.weight": (V, C)})
    return shapes


def _random_weights(config: Any, g: torch.Generator) -> dict[str, Tensor]:
    """Float64 weights for every name: norm weights around 1 (never all ones), a matrix of
    ``n`` inputs ~ N(0, 1/n); a tied output layer is the embedding itself."""
    weights = {}
    for name, shape in _shapes(config).items():
        if name.endswith("norm.weight"):
            weights[name] = 1.0 + 0.3 * torch.randn(shape, generator=g, dtype=torch.float64)
        else:
            weights[name] = torch.randn(shape, generator=g, dtype=torch.float64) * shape[-1] ** -0.5
    if config.tie_embeddings:
        weights["lm_head.weight"] = weights["embed_tokens.weight"]
    return weights


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * weight


def _logits(tokens: Tensor, weights: Mapping[str, Tensor], config: Any) -> Tensor:
    """The decoder's logits ``(B, T, V)`` in float64: embedding, pre-norm blocks (causal
    grouped-query attention with split-half RoPE, SwiGLU), the final norm and the output
    layer."""
    w = {name: t.double() for name, t in weights.items()}
    B, T = tokens.shape
    H, H_kv, C = config.n_heads, config.n_kv_heads, config.d_model
    D, eps = C // H, config.norm_eps
    inv_freq = config.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, D/2)
    cos, sin = angles.cos(), angles.sin()

    def rope(t: Tensor) -> Tensor:  # (B, heads, T, D), channel i turns with i + D/2
        a, b = t[..., :D // 2], t[..., D // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    visible = torch.ones(T, T, dtype=torch.bool).tril()  # (T, T), True = may attend
    x = w["embed_tokens.weight"][tokens]  # (B, T, C)
    for i in range(config.n_layers):
        p = {key: w["layers." + str(i) + "." + key] for key in _BLOCK}
        h = _rms(x, p["input_layernorm.weight"], eps)
        q = (h @ p["self_attn.q_proj.weight"].T).view(B, T, H, D).transpose(1, 2)
        k = (h @ p["self_attn.k_proj.weight"].T).view(B, T, H_kv, D).transpose(1, 2)
        v = (h @ p["self_attn.v_proj.weight"].T).view(B, T, H_kv, D).transpose(1, 2)
        group = torch.arange(H) // (H // H_kv)  # (H,): the key/value head of each query head
        k, v = rope(k)[:, group], v[:, group]  # (B, H, T, D)
        scores = (rope(q) @ k.transpose(-2, -1)) / math.sqrt(D)  # (B, H, T, T)
        heads = scores.masked_fill(~visible, -math.inf).softmax(-1) @ v  # (B, H, T, D)
        x = x + heads.transpose(1, 2).reshape(B, T, C) @ p["self_attn.o_proj.weight"].T
        h = _rms(x, p["post_attention_layernorm.weight"], eps)
        gated = F.silu(h @ p["mlp.gate_proj.weight"].T) * (h @ p["mlp.up_proj.weight"].T)
        x = x + gated @ p["mlp.down_proj.weight"].T
    return _rms(x, w["norm.weight"], eps) @ w["lm_head.weight"].T  # (B, T, V)


# The model --------------------------------------------------------------------------------------


def _listed(names: list[str]) -> str:
    shown = ", ".join("`" + n + "`" for n in names[:4])
    if len(names) > 4:
        return say("{shown} and {more} more", shown=shown, more=len(names) - 4)
    return shown


def _check_names(got: Any, want: dict[str, tuple[int, ...]]) -> None:
    """_Failure unless ``got`` (the student's ``state_dict()``) has exactly the decoder's
    names, each a tensor of its shape."""
    if not isinstance(got, Mapping):
        raise _Failure(say("state_dict() returned {got}, not a dict of tensors",
                           got=_describe(got)))
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing or extra:
        parts = ([say("it lacks {names}", names=_listed(missing))] if missing else []) + (
            [say("it has {names}, which the library's Decoder does not", names=_listed(extra))]
            if extra else [])
        raise _Failure(say("the state_dict does not have the names of the library's Decoder: "
                           "{problems}", problems="; ".join(parts)),
                       say("name the submodules as the library does (`embed_tokens`, `layers`, "
                           "each with `input_layernorm`, `self_attn.q_proj` ..., `mlp.gate_proj` "
                           "..., then `norm` and `lm_head`) and keep other tensors out of the "
                           "state_dict"))
    for key, shape in want.items():
        value = got[key]
        if not isinstance(value, Tensor) or tuple(value.shape) != shape:
            found = tuple(value.shape) if isinstance(value, Tensor) else _describe(value)
            raise _Failure(say("`{key}` has shape {found}, the library's has {shape}", key=key,
                               found=found, shape=shape),
                           say("nn.Linear(n_in, n_out) keeps an (n_out, n_in) weight; the key and "
                               "value projections have n_kv_heads * head_dim outputs"))


def _build(cls: type, config: Any) -> nn.Module:
    """``cls(config)`` through ``_call``, refused when it keeps a layer of the library (its
    config aside)."""
    module = _call(cls, [config], ["config"])
    if not isinstance(module, nn.Module):
        raise _Failure(say("{name}(config) made {module}, not an nn.Module", name=cls.__name__,
                           module=_describe(module)),
                       say("subclass nn.Module and call super().__init__() first"))
    held = _held(module, allowed=(type(config),))
    if held:
        where, what = held
        raise _Failure(say("`{name}` keeps the library's `{what}` (as `{where}`): its "
                           "forward would run that code, not yours", name=cls.__name__,
                           what=what, where=where),
                       say("hold the weights in nn.Embedding, nn.Linear and nn.Parameter, and "
                           "compute with the functions you pasted above"), refused=True)
    return module


def _gradients_reach_every_weight(module: nn.Module, logits: Tensor) -> None:
    """_Failure unless the logits' gradient reaches every parameter: the model trains."""
    module.zero_grad(set_to_none=True)
    if logits.requires_grad:
        logits.double().square().mean().backward()
    dead = [name for name, p in module.named_parameters()
            if p.grad is None or not p.grad.abs().sum() > 0]
    if dead:
        raise _Failure(say("no gradient reaches {names}", names=_listed(dead)),
                       say("compute the logits from the parameters themselves: "
                           "`dict(self.named_parameters(remove_duplicate=False))` keeps them "
                           "connected; state_dict() and .detach() give copies that do not train"))


def check_capstone_lm(cls: type) -> CheckResult:
    """Check the class ``CapstoneLM(config)``: an ``nn.Module`` for a
    :class:`~transformer_lib.decoder.DecoderConfig` (RoPE, split-half pairing) whose
    ``state_dict`` has exactly the names and shapes of the library's ``Decoder(config)``, and
    whose ``forward(tokens)`` maps token ids ``(B, T)`` to the logits ``(B, T, V)`` that the
    library's decoder gives with the same weights.

    The checker builds the class with several configs (grouped-query and multi-query
    attention, tied and untied output layers, a RoPE base and a norm epsilon that are not the
    defaults), loads random float64 weights with ``load_state_dict``, compares the logits with
    a float64 reference, and checks that the gradient reaches every weight. The library is
    refused while the model is built and run: its logits must come from your own pieces.

    Args:
        cls: the class to check, built and called on the checker's own inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    from transformer_lib.decoder import DecoderConfig

    g = _generator()

    def case(T: int, B: int = 2, **sizes: Any) -> Callable[[], None]:
        config = DecoderConfig(**sizes)
        weights = _random_weights(config, g)
        tokens = torch.randint(0, config.vocab_size, (B, T), generator=g)  # (B, T)

        def run() -> None:
            module = _build(cls, config)
            _check_names(_call(module.state_dict, [], []), _shapes(config))
            _call(module.double, [], [])
            _call(module.load_state_dict, [{k: t.clone() for k, t in weights.items()}],
                  ["state_dict"])
            got = _call(module, [tokens], ["tokens"])
            _compare(got, _logits(tokens, weights, config), say("the logits"),
                     letters=say("(B, T, V)"), axes=("batch", "position", "token"),
                     atol=1e-8, rtol=1e-6)
            if T > 1:  # with one key the weight is 1 whatever q and k: they get no gradient
                _gradients_reach_every_weight(module, got)
        return run

    small = {"vocab_size": 23, "d_model": 32, "n_heads": 4, "d_ff": 40, "max_seq_len": 16}
    with torch.random.fork_rng(devices=[]):  # the student's layers draw their own weights
        return _run("CapstoneLM", cls, [
            (say("2 layers, H = 4, H_kv = 2, RoPE base 500, norm eps 1e-2, B = 2, T = 7"),
             case(7, n_layers=2, n_kv_heads=2, rope_theta=500.0, norm_eps=1e-2, **small)),
            (say("1 layer, multi-query attention (H_kv = 1), output layer tied to the "
                 "embedding, T = 5"),
             case(5, n_layers=1, n_kv_heads=1, tie_embeddings=True, **small)),
            (say("one token (T = 1), B = 3"), case(1, B=3, n_layers=1, n_kv_heads=4, **small)),
        ], rules=RULES["CapstoneLM"], kind="class")


# The training loop ------------------------------------------------------------------------------


def _cycle(V: int, n: int) -> Tensor:
    """``(n,)`` ids that run through 0, 1, ..., V - 1 again and again: each id has one
    successor, which a model that learns the next token finds at once."""
    return torch.arange(n) % V


def _bigram_model(V: int, seed: int) -> nn.Module:
    """A model made of the framework's layers only (its forward is not the checker's code):
    one embedding and one output layer, so the logits at t depend on token t alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Sequential(nn.Embedding(V, 16), nn.Linear(16, V))


def _cycle_loss(model: nn.Module, V: int) -> float:
    """The model's mean cross-entropy on the text :func:`_cycle` makes: each token followed
    by the next."""
    with torch.no_grad():
        logits = model(torch.arange(V)[None])[0]  # (V, V)
    return F.cross_entropy(logits, (torch.arange(V) + 1) % V).item()


def _import_the_optimizers() -> None:
    """Take one step of AdamW outside the guard: PyTorch imports much of itself (its compiler,
    SymPy) on an optimizer's first step, which under the guard's watch takes seconds."""
    weight = nn.Parameter(torch.zeros(1))
    weight.grad = torch.ones(1)
    torch.optim.AdamW([weight]).step()


def check_train_lm(train_lm: Callable[..., list]) -> CheckResult:
    """Check ``train_lm(model, ids, steps, batch_size, seq_len, lr, seed=0) -> losses``: train
    ``model`` (token ids ``(B, T)`` to logits ``(B, T, V)``) to predict the next token of
    ``ids`` ``(N,)``, with AdamW at rate ``lr``, on ``steps`` batches of ``batch_size`` random
    windows of ``seq_len`` tokens drawn from a generator seeded with ``seed``, and return the
    ``steps`` training losses (floats, the mean cross-entropy of every position).

    The checker trains a small model of its own on a text in which every token has exactly
    one successor: the losses must fall, the model must then predict each token's successor
    (not the token itself), and the same seed must give the same losses.

    Args:
        train_lm: the function to check, called on the checker's own model and ids.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    _import_the_optimizers()
    V, steps = 12, 30
    ids = _cycle(V, 400)
    names = ["model", "ids", "steps", "batch_size", "seq_len", "lr", "seed"]
    trained: dict[str, Any] = {}  # the first run's model and losses, read by two checks

    def train(n: int, seed: int) -> tuple[nn.Module, list[float]]:
        model = _bigram_model(V, seed=1)
        start = [p.detach().clone() for p in model.parameters()]
        before = _cycle_loss(model, V)
        steps_taken = []

        @given
        def count(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            if isinstance(optimizer, torch.optim.AdamW) and held >= {
                    id(p) for p in model.parameters()}:
                steps_taken.append(1)

        hook = register_optimizer_step_post_hook(count)
        try:
            losses = _call(train_lm, [model, ids, n, 8, 16, 0.1, seed], names)
        finally:
            hook.remove()
        if not isinstance(losses, (list, tuple)) or len(losses) != n:
            raise _Failure(say("returned {got}, not a list of {n} losses (one per step)",
                               got=_describe(losses), n=n),
                           say("append `loss.item()` to a list at every step and return it"))
        if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in losses):
            raise _Failure(say("the losses are not all finite Python numbers"),
                           say("append `loss.item()`, a float, not the loss tensor"))
        if all(torch.equal(p, q) for p, q in zip(model.parameters(), start)):
            raise _Failure(say("the model's weights did not change"),
                           say("build the optimizer on model.parameters() and call "
                               "optimizer.step() after loss.backward()"))
        if len(steps_taken) != n:
            raise _Failure(say("torch.optim.AdamW over the model's parameters took "
                               "{steps} steps, not {n}", steps=len(steps_taken), n=n),
                           say("build one torch.optim.AdamW(model.parameters(), lr=lr) and call "
                               "its step() once per training step"))
        if abs(losses[0] - before) > 0.3:
            raise _Failure(say("the first loss is {first:.2f}, but the untrained model's "
                               "loss on this text is {before:.2f}", first=losses[0],
                               before=before),
                           say("return the loss each step computed, before its update"))
        return model, list(losses)

    def falls() -> None:
        trained["model"], losses = train(steps, seed=0)
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        if not last < first - 1.0:
            raise _Failure(say("the loss went from {first:.2f} (mean of the first 5 steps) to "
                               "{last:.2f} (the last 5): it should fall by more than 1",
                               first=first, last=last),
                           say("zero the gradients before each backward pass, and pass lr on to "
                               "the optimizer"))

    def predicts_the_next_token() -> None:
        model = trained.get("model") or train(steps, seed=0)[0]
        with torch.no_grad():
            guess = model(torch.arange(V)[None]).argmax(-1)[0]  # (V,)
        successor = (torch.arange(V) + 1) % V
        if torch.equal(guess, torch.arange(V)):
            raise _Failure(say("the trained model predicts each token itself, not the next one"),
                           say("the targets are the inputs shifted by one: a window of "
                               "seq_len + 1 tokens gives inputs w[:-1] and targets w[1:]"))
        if (guess == successor).float().mean() < 0.9:
            raise _Failure(say("the trained model predicts the next token for only "
                               "{right} of {V} tokens", right=int((guess == successor).sum()),
                               V=V),
                           say("the loss is the cross-entropy of the logits at every position "
                               "against the token that follows it"))

    def seeded() -> None:
        if train(3, seed=3)[1] != train(3, seed=3)[1]:
            raise _Failure(say("two runs with the same seed gave different losses"),
                           say("draw the windows from a torch.Generator seeded with `seed`"))

    return _run("train_lm", train_lm, [
        (say("30 steps on a text where each token has one successor: the loss falls"), falls),
        (say("the trained model predicts each token's successor"), predicts_the_next_token),
        (say("the same seed gives the same losses"), seeded),
    ], rules=RULES["train_lm"])
