"""The KV-cache memory explorer (chapter 7): the bytes of a model's key/value cache next to the
bytes of its weights, as the model, its number of key/value heads, the context length and the
cache's dtype change.

Every combination is a few numbers, so the frames are text (HTML), not pictures: under 1 kB
a frame, where a picture takes tens of kB. The cache's bytes are ``KVCache.nbytes`` of a
cache built on PyTorch's ``meta`` device (shapes, no data); the weights are the parameters
of the library's ``Decoder`` with the model's published shape, counted by hand (building
four such models, even on the meta device, takes seconds; the tests compare the count with
them).
"""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import torch

from transformer_lib.cache import KVCache
from transformer_lib.plotting.style import BLUE, VERMILLION
from transformer_lib.widgets.frames import (
    Explorer,
    _check_frames,
    _control_row,
    _linked_pictures,
)

#: Published shapes (each model's config.json); the Decoder built from them has each model's
#: published parameter count (tests/test_widgets_kv_memory.py checks all four).
KV_PRESETS: dict[str, dict] = {
    "Llama 3.2 1B": dict(vocab_size=128256, d_model=2048, n_layers=16, n_heads=32,
                         n_kv_heads=8, d_ff=8192, tie_embeddings=True),
    "Llama 2 7B": dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32,
                       n_kv_heads=32, d_ff=11008),
    "Llama 3 8B": dict(vocab_size=128256, d_model=4096, n_layers=32, n_heads=32,
                       n_kv_heads=8, d_ff=14336),
    "Llama 3 70B": dict(vocab_size=128256, d_model=8192, n_layers=80, n_heads=64,
                        n_kv_heads=8, d_ff=28672),
}
KV_CONTEXTS = (2048, 4096, 8192, 16384, 32768, 65536, 131072)  #: the context lengths, in tokens
#: MQA, the published GQA counts, MHA, and one a 32-head model cannot have. Few values: every
#: frame is a widget model, and a cell that opens over about a thousand of them can lose some
#: on their way to the saved page.
KV_HEAD_CHOICES = (1, 8, 32, 64)
KV_DTYPES = ("float32", "bfloat16", "float8_e4m3fn")  #: the cache's dtype; weights: bfloat16
WEIGHT_DTYPE = torch.bfloat16  #: the dtype of the weights the cache is set beside
START = ("Llama 3 8B", 32768, "bfloat16")  #: the first frame: this model, its own KV heads
GB = 1e9  #: bytes in a gigabyte (decimal, as memory sizes are published)


class KvMemoryExplorer(Explorer):
    """The widget :func:`kv_memory_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``model``,
    ``kv_heads``, ``context``, ``dtype``, ``pictures`` ``{"memory": …}`` and ``links``, it
    holds:

    Attributes:
        table: ``(model, kv_heads, context, dtype) -> (weight bytes, cache bytes)`` for every
            combination a model allows (``None`` where ``kv_heads`` does not divide its
            query heads).
    """

    table: dict[tuple[str, int, int, str], tuple[int, int] | None]

    def __init__(self, children: Sequence[widgets.Widget], *, table: dict, **parts) -> None:
        super().__init__(children, **parts)
        self.table = table


def _head_dim(preset: dict) -> int:
    return preset["d_model"] // preset["n_heads"]


def _parameters(name: str, n_kv_heads: int) -> int:
    """Parameters of the library's ``Decoder`` with model ``name``'s shape and ``n_kv_heads``
    key/value heads, counted by hand: embeddings (twice unless tied), a final RMSNorm, and
    per layer the four attention projections (no biases), SwiGLU's three matrices and two
    RMSNorms."""
    p = KV_PRESETS[name]
    d, D = p["d_model"], _head_dim(p)
    attention = d * p["n_heads"] * D * 2 + d * n_kv_heads * D * 2  # q, o; k, v
    layer = attention + 3 * d * p["d_ff"] + 2 * d
    embeddings = p["vocab_size"] * d * (1 if p.get("tie_embeddings") else 2)
    return embeddings + d + p["n_layers"] * layer


def _weight_bytes(name: str, n_kv_heads: int) -> int:
    """Bytes of model ``name``'s weights in bfloat16 with ``n_kv_heads`` key/value heads."""
    return _parameters(name, n_kv_heads) * WEIGHT_DTYPE.itemsize


def _cache_bytes(name: str, n_kv_heads: int, context: int, dtype: str) -> int:
    """``KVCache.nbytes`` of one sequence of ``context`` positions of model ``name`` (meta)."""
    preset = KV_PRESETS[name]
    cache = KVCache(preset["n_layers"], 1, n_kv_heads, context, _head_dim(preset),
                    dtype=getattr(torch, dtype), device="meta")
    return cache.nbytes


def _per_token(n_bytes: int) -> str:
    """Bytes in kB (10^3) below a million, else in MB (10^6), to three digits or more."""
    return f"{n_bytes / 1e3:.3g} kB" if n_bytes < 1e6 else f"{n_bytes / 1e6:.3g} MB"


def _amount(n_bytes: int) -> str:
    """Bytes in GB (10^9) to two decimals from 0.1 GB, else in MB (10^6) to three digits."""
    return f"{n_bytes / GB:,.2f} GB" if n_bytes >= 0.1 * GB else f"{n_bytes / 1e6:.3g} MB"


def _bar(label: str, n_bytes: int, largest: int, colour: str) -> str:
    """One labelled horizontal bar, as long as ``n_bytes`` is against ``largest``."""
    width = max(100 * n_bytes / largest, 0.4)
    return (f'<div style="display:flex;align-items:center;gap:6px">'
            f'<span style="flex:0 0 5.4em;white-space:nowrap">{label}</span>'
            f'<span style="flex:1 1 0" aria-hidden="true"><span style="display:block;'
            f'height:14px;width:{width:.1f}%;background:{colour}"></span></span>'
            f'<span style="flex:0 0 5.6em;text-align:right">{_amount(n_bytes)}</span></div>')


def _kv_memory_frame(name: str, n_kv_heads: int, context: int, dtype: str,
                     budget_gb: float) -> str:
    """The HTML frame of one combination: the cache formula with its factors, bars for the
    weights and the cache (the larger one full width), and what fits in ``budget_gb``."""
    preset = KV_PRESETS[name]
    H, L, D = preset["n_heads"], preset["n_layers"], _head_dim(preset)
    if H % n_kv_heads:
        return (f'<div style="line-height:1.45"><b>{name}</b> cannot have {n_kv_heads} '
                f'key/value heads: its {H} query heads share them in equal groups, so their '
                f'number must divide {H}.</div>')
    weights, cache = _weight_bytes(name, n_kv_heads), _cache_bytes(name, n_kv_heads,
                                                                   context, dtype)
    kind = ("MHA: one per query head" if n_kv_heads == H else "MQA: one for all query heads"
            if n_kv_heads == 1 else f"GQA: {H // n_kv_heads} query heads share each")
    size = getattr(torch, dtype).itemsize
    budget = budget_gb * GB
    n_fit = int((budget - weights) // cache) if weights <= budget else -1
    fits = (f"the weights alone exceed {budget_gb:g} GB" if n_fit < 0 else
            f"{budget_gb:g} GB hold the weights but not one such sequence" if n_fit == 0 else
            f"{budget_gb:g} GB hold the weights and {n_fit:,} such "
            f"sequence{'s' if n_fit > 1 else ''}")
    heads = "heads" if n_kv_heads > 1 else "head"
    return (f'<div style="line-height:1.45"><div><b>{name}</b>, {n_kv_heads} key/value '
            f'{heads} ({kind}; published: {preset["n_kv_heads"]})</div><div>cache of '
            f'{context:,} tokens in {dtype}: 2 × {L} layers × {n_kv_heads} {heads} × '
            f'{D} channels × {context:,} × {size} byte{"s" if size > 1 else ""}'
            f'</div>{_bar("weights", weights, max(weights, cache), BLUE)}'
            f'{_bar("KV cache", cache, max(weights, cache), VERMILLION)}'
            f'<div>cache ÷ weights {cache / weights:.3g}; {_per_token(cache // context)} per '
            f'token; {fits}</div></div>')


def _kv_memory_caption(budget_gb: float) -> widgets.HTML:
    """What the explorer shows and what to try."""
    return widgets.HTML(
        "<b>The KV cache next to the weights, for one sequence.</b> Choose a model, its "
        "number of key/value heads, the context length and the dtype the cache is stored in; "
        "the weights stay in bfloat16 (2 bytes a parameter). GB are 10<sup>9</sup> bytes; the "
        "cache is <code>KVCache.nbytes</code> and the weights are the parameters of the "
        f"library's <code>Decoder</code> with the model's shape; the last line says "
        f"how many sequences of this length fit beside the weights in {budget_gb:g} GB.")


def _check_arguments(models: Sequence[str], kv_heads: Sequence[int], contexts: Sequence[int],
                     dtypes: Sequence[str], budget_gb: float) -> None:
    """Raise a ValueError naming the bad values, if any."""
    unknown = [m for m in models if m not in KV_PRESETS]
    if unknown or not models:
        raise ValueError(f"models must be some of {list(KV_PRESETS)}, got {list(models)}")
    for label, values in (("kv_heads", kv_heads), ("contexts", contexts)):
        if not values or any(not isinstance(v, int) or v < 1 for v in values):
            raise ValueError(f"{label} must be positive integers, got {list(values)}")
    bad = [d for d in dtypes if not isinstance(getattr(torch, str(d), None), torch.dtype)
           or not getattr(torch, d).is_floating_point or d.endswith("_x2")]  # x2: 2 a byte
    if bad or not dtypes:
        raise ValueError(f"dtypes must name floating-point torch dtypes of one value a byte or "
                         f"more, such as {list(KV_DTYPES)}, got {list(dtypes)}")
    if not budget_gb > 0:
        raise ValueError(f"budget_gb must be > 0, got {budget_gb}")


def kv_memory_explorer(*, models: Sequence[str] = tuple(KV_PRESETS),
                       kv_heads: Sequence[int] = KV_HEAD_CHOICES,
                       contexts: Sequence[int] = KV_CONTEXTS,
                       dtypes: Sequence[str] = KV_DTYPES,
                       budget_gb: float = 80.0) -> KvMemoryExplorer:
    """Explore the memory of a KV cache next to the weights, with or without a kernel.

    Args:
        models: names of ``KV_PRESETS`` to choose from.
        kv_heads: key/value head counts to choose from (a model takes those dividing its
            query heads; the others show why not).
        contexts: context lengths in tokens.
        dtypes: names of torch dtypes for the cache (the weights are bfloat16).
        budget_gb: accelerator memory in GB (10^9 bytes) that the last line fills.

    Returns:
        A :class:`KvMemoryExplorer` (a VBox, shown as the widget) with controls ``model``
        (a Dropdown), ``kv_heads``, ``context`` (SelectionSliders) and ``dtype`` (a
        Dropdown), each picking a frame by ``index``, and one picture,
        ``pictures["memory"]``: ``models × kv_heads × contexts × dtypes`` HTML frames.
    """
    models, kv_heads, contexts, dtypes = list(models), list(kv_heads), list(contexts), \
        list(dtypes)
    _check_arguments(models, kv_heads, contexts, dtypes, budget_gb)
    _check_frames("kv_memory_explorer", {"models": len(models), "kv_heads": len(kv_heads),
                                         "contexts": len(contexts), "dtypes": len(dtypes)})
    table = {}
    for m in models:
        for h in kv_heads:
            for t in contexts:
                for d in dtypes:
                    allowed = KV_PRESETS[m]["n_heads"] % h == 0
                    table[m, h, t, d] = ((_weight_bytes(m, h), _cache_bytes(m, h, t, d))
                                         if allowed else None)
    frames = [[[[_kv_memory_frame(m, h, t, d, budget_gb) for d in dtypes] for t in contexts]
               for h in kv_heads] for m in models]  # [model][kv_heads][context][dtype]

    style = {"description_width": "80px"}
    controls = {
        "model": widgets.Dropdown(options=[(m, i) for i, m in enumerate(models)],
                                  description="model", style=style),
        "kv_heads": widgets.SelectionSlider(options=[(str(h), h) for h in kv_heads],
                                            description="KV heads", style=style),
        "context": widgets.SelectionSlider(
            options=[(f"{t // 1024}k" if t % 1024 == 0 else str(t), t) for t in contexts],
            description="context", style=style),
        "dtype": widgets.Dropdown(options=[(d, i) for i, d in enumerate(dtypes)],
                                  description="cache dtype", style=style),
    }
    start = {"model": models.index(START[0]) if START[0] in models else 0}
    for name, values, wanted in (("kv_heads", kv_heads, KV_PRESETS[models[start["model"]]]
                                  ["n_kv_heads"]), ("context", contexts, START[1]),
                                 ("dtype", dtypes, START[2])):
        start[name] = values.index(wanted) if wanted in values else 0
    for name, index in start.items():  # before the pictures: they start on this frame
        controls[name].index = index
    picture, links = _linked_pictures(frames, [(controls[name], "index") for name in controls])
    return KvMemoryExplorer([_kv_memory_caption(budget_gb), _control_row(*controls.values()),
                             picture], controls=controls, pictures={"memory": picture},
                            links=links, table=table)
