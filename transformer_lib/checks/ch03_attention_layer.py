"""Checker for the core of chapter 3 (``chapters/03_multi_head.ipynb``), written by the
learner where the chapter builds it: multi-head self-attention as one module, whose H query
heads share H_kv key/value heads (grouped-query attention), with the weights of the library's
:class:`~transformer_lib.attention.MultiHeadAttention`, so that a ``state_dict`` loads from one
into the other.

The reference is written out here independently of the library, in float64, from the four
projections' weights; the weight names and shapes to match are taken from the library's layer
itself. The exercise asks for a class: the checker builds it, reads and loads its
``state_dict`` and runs its forward pass, each through the harness's ``_call``."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import torch
from torch import Tensor, nn

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.checks._guard import Rules
from transformer_lib.checks._harness import (
    CheckResult,
    _call,
    _compare,
    _describe,
    _expect_value_error,
    _Failure,
    _generator,
    _run,
)
from transformer_lib.checks._messages import say

#: What the student's code may call in each exercise: exercise function -> its
#: :class:`~transformer_lib.checks.Rules` (enforced by the guard while the function runs).
RULES = {
    "GroupedQueryAttention": Rules(refuse=(
        "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
        "torch.nn.functional.scaled_dot_product_attention")),
}

_LIBRARY = "transformer_lib"
# The framework's ready-made attention layer, which a submission must not be built on either.
_FRAMEWORK_LAYERS = {nn.MultiheadAttention: "torch.nn.MultiheadAttention"}
_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


# The reference ----------------------------------------------------------------------------------


def _gqa(x: Tensor, state: Mapping[str, Tensor], H: int, H_kv: int, mask: Tensor | None, *,
         kv: str = "blocks", split: str = "right", scale: str = "head",
         mask_to: str = "heads", merge: str = "right") -> Tensor | None:
    """The layer's output ``(B, T, C)`` in float64 for the weights ``state`` (the library's
    names) and the input ``x`` ``(B, T, C)``; the defaults are the reference, each keyword
    one of the usual mistakes (None where that mistake cannot run on these inputs):

    * ``kv="tiled"``: query head h reads key/value head ``h % H_kv`` (``repeat``), not
      ``h // (H / H_kv)``;
    * ``split="view"``: ``view(B, H, T, D)`` straight from ``(B, T, C)``;
      ``split="no_transpose"``: the heads left behind the positions, ``(B, T, H, D)``;
    * ``scale="none"`` or ``"model"``: no scale, or ``1/√C`` instead of ``1/√D``;
    * ``mask_to="groups"``: the mask applied to scores laid out ``(B, H_kv, H/H_kv, T, S)``
      without an axis for the groups; ``"nowhere"``: the mask ignored;
    * ``merge="no_transpose"``: ``reshape(B, T, C)`` straight from ``(B, H, T, D)``;
      ``merge="stacked"``: each position's channels in the order ``(D, H)``.
    """
    x = x.double()
    B, T, C = x.shape
    D, n_rep = C // H, H // H_kv

    def project(name: str, inputs: Tensor) -> Tensor:
        out = inputs @ state[name + ".weight"].double().T  # (B, T, out_features)
        bias = state.get(name + ".bias")
        return out if bias is None else out + bias.double()

    q, k, v = (project(name, x) for name in _PROJECTIONS[:3])  # (B, T, C), 2 x (B, T, H_kv*D)
    if split == "right":
        q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, D)
    elif split == "view":
        q, k, v = (t.reshape(B, -1, T, D) for t in (q, k, v))  # (B, heads, T, D) by shape only
    else:  # "no_transpose"
        if mask is not None:
            return None  # the scores are (B, T, H, H): a (T, T) mask does not fit them
        q, k, v = (t.view(B, T, -1, D) for t in (q, k, v))  # (B, T, heads, D)
    heads = 2 if split == "no_transpose" else 1
    group = torch.arange(H) // n_rep if kv == "blocks" else torch.arange(H) % H_kv  # (H,)
    k, v = k.index_select(heads, group), v.index_select(heads, group)  # H heads each
    factor = {"head": D ** -0.5, "none": 1.0, "model": C ** -0.5}[scale]
    scores = (q @ k.transpose(-2, -1)) * factor  # (B, H, T, S), or (B, T, H, H)
    if mask is not None and mask_to == "heads":
        scores = scores.masked_fill(~mask, float("-inf"))
    elif mask is not None and mask_to == "groups":
        try:  # (1, B, 1, 1, S) against (B, H_kv, n_rep, T, S): B lands on the groups
            grouped = scores.view(B, H_kv, n_rep, T, T).masked_fill(~mask, float("-inf"))
        except RuntimeError:
            return None
        scores = grouped.view(B, H, T, T)
    weights = (scores - scores.amax(dim=-1, keepdim=True)).exp()
    weights = weights / weights.sum(dim=-1, keepdim=True)  # every query sees a key here
    out = weights @ v  # (B, H, T, D), or (B, T, H, D)
    if split == "no_transpose" or merge == "no_transpose":
        out = out.reshape(B, T, C)
    elif merge == "stacked":
        out = out.permute(0, 2, 3, 1).reshape(B, T, C)  # (B, T, D, H) -> (B, T, C)
    else:
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, H, D) -> (B, T, C)
    return project("o_proj", out)  # (B, T, C)


def _mistakes(x: Tensor, state: Mapping[str, Tensor], H: int, H_kv: int,
              mask: Tensor | None) -> list[tuple[Tensor, str]]:
    """(output, hint) of each usual mistake that gives another output on these inputs."""
    C = x.shape[-1]
    D, n_rep = C // H, H // H_kv
    table = [
        ({"kv": "tiled"},
         say("query head h must read key/value head h // {n_rep}: each key/value head serves "
             "{n_rep} neighbouring query heads, so repeat each one {n_rep} times in a row "
             "(repeat_interleave({n_rep}, dim=1)); yours reads head h % {H_kv}, the order "
             "that repeat(1, n, 1, 1) gives", n_rep=n_rep, H_kv=H_kv)),
        ({"split": "view"},
         say("the heads were cut with view(B, H, T, D) straight from (B, T, C): that re-reads "
             "the memory, so a head's rows are not positions. Cut the channels with "
             "view(B, T, H, D), then transpose(1, 2)")),
        ({"split": "no_transpose"},
         say("the heads were not moved in front of the positions: after view(B, T, H, D), "
             "transpose(1, 2) to (B, H, T, D), or the attention runs across the heads of one "
             "position instead of across the positions")),
        ({"scale": "none"}, say("divide the scores by √D = √{D}, the width of one head, "
                                "before the softmax", D=D)),
        ({"scale": "model"}, say("the scale is 1/√D with D = {D}, the width of one head, not "
                                 "1/√C with the layer's width C = {C}", D=D, C=C)),
        ({"mask_to": "groups"},
         say("sequence b's mask was applied to key/value group b: with the scores laid out "
             "(B, H_kv, H/H_kv, T, S), give the mask an axis for the group (mask.unsqueeze(2) "
             "for a 4-dimensional mask) so that it broadcasts over the heads and stays with "
             "its own sequence")),
        ({"mask_to": "nowhere"}, say("the mask was not applied: set the blocked scores to "
                                     "-inf before the softmax")),
        ({"merge": "no_transpose"},
         say("the heads were merged with reshape(B, T, C) straight from (B, H, T, D): "
             "transpose(1, 2) back to (B, T, H, D) first, so that each output row holds one "
             "position's heads side by side")),
        ({"merge": "stacked"},
         say("the heads' channels are interleaved, (B, T, D, H), as torch.stack(heads, "
             "dim=-1) makes them: the concatenation puts head 0's D channels first, then head "
             "1's, as torch.cat(heads, dim=-1) or transpose(1, 2).reshape(B, T, C) does")),
    ]
    want = _gqa(x, state, H, H_kv, mask)
    found = []
    for kwargs, hint in table:
        wrong = _gqa(x, state, H, H_kv, mask, **kwargs)
        if wrong is not None and not torch.allclose(wrong, want, atol=1e-6):
            found.append((wrong, hint))
    return found


# The weights: names, shapes and a round trip -----------------------------------------------------


def _library_shapes(C: int, H: int, H_kv: int, bias: bool) -> dict[str, tuple[int, ...]]:
    """The ``state_dict`` of ``MultiHeadAttention(C, H, n_kv_heads=H_kv, bias=bias)``: each
    key with its shape (built on the meta device: no weight is made)."""
    with torch.device("meta"):
        layer = MultiHeadAttention(C, H, n_kv_heads=H_kv, bias=bias)
    return {name: tuple(t.shape) for name, t in layer.state_dict().items()}


def _random_state(shapes: dict[str, tuple[int, ...]], g: torch.Generator) -> dict[str, Tensor]:
    """Random float64 weights for every key: a weight of ``n`` inputs ~ N(0, 1/n), a bias
    ~ N(0, 1/4), so that no entry is 0 or 1 and a wrong mapping changes the output."""
    return {name: torch.randn(shape, generator=g, dtype=torch.float64)
            * (shape[-1] ** -0.5 if name.endswith("weight") else 0.5)
            for name, shape in shapes.items()}


def _listed(names: list[str]) -> str:
    return ", ".join("`" + n + "`" for n in names)


def _check_keys(got: Any, want: dict[str, tuple[int, ...]], C: int, H: int, H_kv: int,
                bias: bool) -> None:
    """_Failure unless ``got`` (the student's ``state_dict()``) has exactly the library's keys,
    each a tensor of the library's shape; the message names the missing and the extra ones."""
    if not isinstance(got, Mapping):
        raise _Failure(say("state_dict() returned {got}, not a dict of tensors",
                           got=_describe(got)))
    missing = [k for k in want if k not in got]
    extra = [k for k in got if k not in want]
    if missing or extra:
        parts = ([say("it lacks {names}", names=_listed(missing))] if missing else []) + (
            [say("it has {names}, which the library's layer does not", names=_listed(extra))]
            if extra else [])
        if not bias and not missing and all(k.endswith(".bias") for k in extra):
            hint = say("with bias=False the projections have no bias: pass bias on to nn.Linear")
        elif bias and not extra and all(k.endswith(".bias") for k in missing):
            hint = say("the projections have biases unless bias=False: pass bias on to "
                       "nn.Linear")
        else:
            hint = say("name the four projections as the library does, q_proj, k_proj, v_proj "
                       "and o_proj, each an nn.Linear, and keep other tensors out of the "
                       "state_dict (a buffer registered with persistent=False is not saved)")
        raise _Failure(say("the state_dict does not have the keys of the library's layer: "
                           "{problems}", problems="; ".join(parts)), hint)
    D = C // H
    for key, shape in want.items():
        value = got[key]
        if not isinstance(value, Tensor):
            raise _Failure(say("state_dict()[{key!r}] is {got}, not a tensor", key=key,
                               got=_describe(value)))
        if tuple(value.shape) != shape:
            hint = say("nn.Linear(in_features, out_features) stores its weight as "
                       "(out_features, in_features)")
            if key.startswith(("k_proj", "v_proj")) and value.shape[0] == C != shape[0]:
                hint = say("k_proj and v_proj make H_kv · D = {H_kv} · {D} = {outputs} "
                           "outputs, one block of D per key/value head, not C = {C}",
                           H_kv=H_kv, D=D, outputs=H_kv * D, C=C)
            raise _Failure(say("`{key}` has shape {got}; in the library's layer it is "
                               "{shape}", key=key, got=tuple(value.shape), shape=shape), hint)


def _check_round_trip(got: Any, loaded: Mapping[str, Tensor]) -> None:
    """_Failure unless ``got`` (``state_dict()`` after ``load_state_dict(loaded)``) gives back
    exactly the loaded tensors: what the library's layer would then load from it."""
    for key, value in loaded.items():
        back = got.get(key) if isinstance(got, Mapping) else None
        if not isinstance(back, Tensor) or not torch.equal(back.detach().double(), value):
            raise _Failure(say("after load_state_dict(), state_dict() does not give back the "
                               "loaded `{key}`", key=key),
                           say("keep the weights in the four nn.Linear layers, which "
                               "load_state_dict() fills and state_dict() reads"))


# Built on the library? -------------------------------------------------------------------------


def _borrowed_class(kind: type) -> str | None:
    """The library's class, or the framework's attention layer, among ``kind``'s bases."""
    for base in kind.__mro__:
        if base in _FRAMEWORK_LAYERS:
            return _FRAMEWORK_LAYERS[base]
        if (getattr(base, "__module__", None) or "").split(".")[0] == _LIBRARY:
            return base.__module__ + "." + base.__qualname__
    return None


def _borrowed(value: Any) -> str | None:
    """What of the library's (or the framework's attention layer) ``value`` is: an instance
    of its classes, or one of its functions or methods."""
    if isinstance(value, type):
        return None
    function = getattr(value, "__func__", value)
    if callable(function) and hasattr(function, "__code__"):
        module = getattr(function, "__module__", None) or ""
        if module.split(".")[0] == _LIBRARY:
            return module + "." + function.__qualname__
        return None
    return _borrowed_class(type(value))


def _held(module: nn.Module, allowed: tuple[type, ...] = ()) -> tuple[str, str] | None:
    """``(where, what)`` for the first library layer (or library function) that ``module``
    keeps: as a submodule, an attribute, an item of an attribute, or an attribute of its
    class. Instances of the ``allowed`` classes (a config, say) do not count."""
    named = list(nn.Module.named_modules(module))
    for path, sub in named:
        what = _borrowed_class(type(sub))
        if what:
            return path or say("itself"), what
    for path, sub in named:
        places = [(path + "." + key if path else key, value)
                  for key, value in vars(sub).items()]
        for kind in type(sub).__mro__:
            if (kind.__module__ or "").split(".")[0] not in ("torch", "builtins"):
                places += [(kind.__qualname__ + "." + key, value)
                           for key, value in vars(kind).items()]
        for where, value in places:
            items = (list(value.values()) if isinstance(value, dict) else list(value)
                     if isinstance(value, (list, tuple, set, frozenset)) else [value])
            for item in items:
                what = None if isinstance(item, allowed) else _borrowed(item)
                if what:
                    return where, what
    return None


def _build(cls: type, args: list[Any], names: list[str]) -> nn.Module:
    """``cls(*args)`` through ``_call``, refused when ``cls`` is built on the library's layer
    or keeps one: its inherited methods, or the layer it keeps, would run the library's code
    for it."""
    name = cls.__name__
    base = _borrowed_class(cls)
    if base:
        raise _Failure(say("`{name}` is built on `{base}`: its inherited methods are not your "
                           "code", name=name, base=base),
                       say("subclass nn.Module, make the four projections with nn.Linear and "
                           "write the attention with tensor operations"), refused=True)
    module = _call(cls, args, names)
    if not isinstance(module, nn.Module):
        raise _Failure(say("{name}(...) made {got}, not an nn.Module", name=name,
                           got=_describe(module)),
                       say("subclass nn.Module and call super().__init__() first"))
    held = _held(module)
    if held:
        where, what = held
        raise _Failure(say("`{name}` keeps the library's `{what}` (as `{where}`): its forward "
                           "would run that code, not yours", name=name, what=what, where=where),
                       say("make the four projections with nn.Linear and write the attention "
                           "with tensor operations"), refused=True)
    return module


# The checker -----------------------------------------------------------------------------------


def check_grouped_query_attention(cls: type) -> CheckResult:
    """Check the class ``GroupedQueryAttention(d_model, n_heads, n_kv_heads=None,
    bias=True)``: an ``nn.Module`` whose ``state_dict`` has exactly the keys and shapes of
    :class:`~transformer_lib.attention.MultiHeadAttention` with the same arguments, and whose
    ``forward(x, mask=None)`` is that layer's self-attention: x ``(B, T, C)``, a boolean mask
    broadcastable to ``(B, 1, T, T)`` (True = may attend), the output ``(B, T, C)``; query
    head h reads key/value head ``h // (n_heads / n_kv_heads)``. Sizes that do not divide
    raise a ValueError naming them.

    The checker builds the class with several sizes (ordinary multi-head, multi-query and
    grouped-query attention, with and without biases), loads random float64 weights into it
    with ``load_state_dict`` and compares its output with a float64 reference. A class built
    on the library's layer, or one that keeps such a layer, is refused.

    Args:
        cls: the class to check (the exercise's), built and called on the checker's own
            inputs.

    Returns:
        A :class:`~transformer_lib.checks.CheckResult`, truthy when every check passed;
        its report is printed.
    """
    g = _generator()

    def case(C: int, H: int, H_kv: int, B: int, T: int, mask: Tensor | None = None,
             bias: bool = True) -> Callable[[], None]:
        x = torch.randn(B, T, C, generator=g, dtype=torch.float64)  # (B, T, C)
        shapes = _library_shapes(C, H, H_kv, bias)
        state = _random_state(shapes, g)
        names = ["d_model", "n_heads", "n_kv_heads", "bias"]
        # Ordinary multi-head attention leaves n_kv_heads out: its default is n_heads.
        args = [C, H] + ([] if H_kv == H and bias else [H_kv]) + ([] if bias else [False])

        def run() -> None:
            module = _build(cls, args, names[:len(args)])
            _check_keys(_call(module.state_dict, [], []), shapes, C, H, H_kv, bias)
            _call(module.double, [], [])
            _call(module.load_state_dict, [{k: t.clone() for k, t in state.items()}],
                  ["state_dict"])
            inputs = [x] if mask is None else [x, mask]
            got = _call(module, inputs, ["x", "mask"][:len(inputs)])
            _compare(got, _gqa(x, state, H, H_kv, mask), say("the output"),
                     letters=say("(B, T, C)"),
                     axes=(say("batch"), say("position"), say("channel")),
                     mistakes=_mistakes(x, state, H, H_kv, mask),
                     nan_hint=say("NaN comes from a row of scores that is all -inf: block the "
                                  "scores where the mask is False, not where it is True"))
            _check_round_trip(_call(module.state_dict, [], []), state)
        return run

    def sizes_that_do_not_divide() -> None:
        _expect_value_error(cls, [30, 6, 4], say("6 query heads cannot share 4 key/value "
                                                 "heads equally"), must_name=["6", "4"])
        _expect_value_error(cls, [20, 3], say("a width of 20 cannot be cut into 3 heads"),
                            must_name=["20", "3"])

    padded = torch.ones(2, 1, 1, 7, dtype=torch.bool)  # (B, 1, 1, T)
    padded[1, ..., 4:] = False  # the second sequence's last three tokens are padding
    both = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    both[0, ..., 3:] = False
    both = both & torch.ones(5, 5, dtype=torch.bool).tril()  # (B, 1, T, T)
    causal = torch.ones(6, 6, dtype=torch.bool).tril()  # (T, T)
    with torch.random.fork_rng(devices=[]):  # the student's nn.Linear draws its own weights
        return _run("GroupedQueryAttention", cls, [
            (say("H = H_kv = 4 (ordinary multi-head attention, n_kv_heads left out), C = 16, "
                 "B = 2, T = 5, no mask"), case(16, 4, 4, 2, 5)),
            (say("H = 4, H_kv = 1 (multi-query attention), a causal mask (T, T)"),
             case(16, 4, 1, 2, 6, causal)),
            (say("H = 6, H_kv = 2 (three query heads per key/value head), a padding mask "
                 "(B, 1, 1, T)"), case(24, 6, 2, 2, 7, padded)),
            (say("H = 8, H_kv = 2, bias=False, padding and causal mask (B, 1, T, T)"),
             case(32, 8, 2, 2, 5, both, bias=False)),
            (say("one token (T = 1), a batch of 3, H = 4, H_kv = 2"), case(16, 4, 2, 3, 1)),
            (say("sizes that do not divide raise a ValueError that names them"),
             sizes_that_do_not_divide),
        ], rules=RULES["GroupedQueryAttention"], kind="class")
