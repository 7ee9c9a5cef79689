"""The sampling explorer (chapter 6): temperature, top-k and top-p applied to the next-character
distribution of the bundled character model, and what one seeded draw continues the prompt with.

Every combination of the three rules is rendered in advance (one frame each): the bars of the
most likely next characters before and after the cut, and the continuation sampled with that
rule and a fixed seed, so the explorer works in the static book.
"""
from __future__ import annotations

import html
import textwrap
from typing import Optional, Sequence

import ipywidgets as widgets
import torch
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from torch import Tensor

from transformer_lib.decoder import Decoder
from transformer_lib.plotting.style import BLUE, DPI, GREY
from transformer_lib.sampling import check_sampling, next_token_probs, sample_next_token
from transformer_lib.text import CharTokenizer, load_text_model
from transformer_lib.widgets.frames import (
    FRAME_WIDTH,
    NARROW_FONT,
    NARROW_WIDTH,
    Explorer,
    Frames,
    _check_frames,
    _control_row,
    _labels,
    _picture_sets,
    _render_frames,
)

PROMPT = "MACBETH.\nI have s"  #: the next character is open: several are likely
TEMPERATURES = (0.0, 0.5, 0.8, 1.0, 1.5)  #: 0 is greedy decoding
TOP_KS = (None, 10, 3)  #: None: no top-k cut
TOP_PS = (None, 0.9, 0.6)  #: None: no top-p cut
N_BARS = 12  #: the most likely characters shown as bars
SAMPLING_FRAME = (FRAME_WIDTH, 5.4)  #: inches: bars above, the continuation below
SAMPLING_NARROW_FRAME = (NARROW_WIDTH, 5.8)  #: inches: the same on a phone
#: The frames shrink to about half their width on a phone: larger text than FONT.
SAMPLING_FONT = 14
TEXT_COLUMNS, TEXT_LINES = 56, 6  # the continuation's box, in monospace characters and lines
NARROW_COLUMNS, NARROW_LINES = 36, 6  # the same box on a phone

Rule = tuple[float, Optional[int], Optional[float]]  #: (temperature, top_k, top_p)


class SamplingExplorer(Explorer):
    """The widget :func:`sampling_explorer` returns.

    Besides :class:`~transformer_lib.widgets.frames.Explorer`'s ``controls`` ``temperature``,
    ``top_k``, ``top_p``, ``pictures`` ``{"sampling": …}`` and ``links``, it holds:

    Attributes:
        prompt: the text the model continues.
        logits: ``(V,)``, the model's logits for the character after ``prompt``.
        continuations: ``(temperature, top_k, top_p)`` -> the characters sampled after
            ``prompt`` with that rule and the explorer's seed.
    """

    prompt: str
    logits: Tensor
    continuations: dict[Rule, str]

    def __init__(self, children: Sequence[widgets.Widget], *, prompt: str, logits: Tensor,
                 continuations: dict[Rule, str], **parts) -> None:
        super().__init__(children, **parts)
        self.prompt, self.logits, self.continuations = prompt, logits, dict(continuations)


def _show_char(c: str) -> str:
    """A character as a tick label: a space and a line break made visible."""
    return {" ": "␣", "\n": "↵"}.get(c, c)


def _rule_name(rule: Rule) -> str:
    """E.g. ``temperature 1.0, top-k 10, top-p off``; greedy at temperature 0."""
    temperature, top_k, top_p = rule
    if temperature == 0:
        return "greedy (temperature 0)"
    k = "off" if top_k is None else top_k
    p = "off" if top_p is None else top_p
    return f"temperature {temperature}, top-k {k}, top-p {p}"


def _sampling_bars(logits: Tensor, rule: Rule) -> tuple[Tensor, Tensor]:
    """The distribution at the rule's temperature alone and the one a draw uses.

    Args:
        logits: ``(V,)`` next-token logits.
        rule: ``(temperature, top_k, top_p)``.

    Returns:
        ``(before, after)``, ``(V,)`` each in fp32: ``softmax(logits / temperature)`` (one-hot
        on the argmax at temperature 0), and :func:`next_token_probs` of the rule (zero
        outside the kept tokens, renormalised over them).
    """
    temperature, top_k, top_p = rule
    row = logits.float()[None]  # (1, V)
    before = next_token_probs(row, temperature=temperature)[0]  # (V,)
    after = next_token_probs(row, temperature=temperature, top_k=top_k, top_p=top_p)[0]  # (V,)
    return before, after


def _continuation_text(prompt: str, continuation: str, columns: int = TEXT_COLUMNS,
                       n_lines: int = TEXT_LINES) -> str:
    """Prompt and continuation folded into the text box: at most ``n_lines`` lines of
    ``columns`` characters."""
    lines = [piece for line in (prompt + continuation).split("\n")
             for piece in (textwrap.wrap(line, columns) or [""])]
    if len(lines) > n_lines:
        lines = lines[:n_lines - 1] + [lines[n_lines - 1][:columns - 1] + "…"]
    return "\n".join(lines)


def _sampling_frames(logits: Tensor, chars: str, prompt: str, rules: Sequence[Rule],
                     continuations: Sequence[str], seed: int,
                     narrow: bool = False) -> list[bytes]:
    """One PNG frame per rule: bars of the ``N_BARS`` most likely next characters after
    ``prompt`` (grey: at the rule's temperature alone; blue: what the draw uses after top-k
    and top-p), and ``prompt`` with the continuation sampled with that rule.

    Args:
        logits: ``(V,)`` next-character logits; ``chars``: the V characters, by id.
        rules: ``(temperature, top_k, top_p)`` of each frame.
        continuations: the sampled text of each rule; ``seed``: the seed it was drawn with.
        narrow: the frames for a phone (``NARROW_WIDTH`` wide, the text in shorter lines).

    Returns:
        ``len(rules)`` PNGs; frame j depends on ``rules[j]`` and ``continuations[j]`` only.
    """
    n_bars = min(N_BARS, len(chars))
    order = torch.sort(logits.float(), descending=True, stable=True).indices[:n_bars]
    size = NARROW_FONT if narrow else SAMPLING_FONT
    columns, n_lines = (NARROW_COLUMNS, NARROW_LINES) if narrow else (TEXT_COLUMNS, TEXT_LINES)
    fig = Figure(figsize=SAMPLING_NARROW_FRAME if narrow else SAMPLING_FRAME, dpi=DPI,
                 layout="constrained")
    ax, text_ax = fig.subplots(2, 1, height_ratios=(3, 2))
    ax.set(xlim=(-0.6, n_bars - 0.4), ylim=(0, 1.05))
    ax.set_xticks(range(n_bars), [_show_char(chars[i]) for i in order.tolist()])
    _labels(ax, f"the {n_bars} most likely next characters", "probability", size)
    if narrow:
        ax.set_title("\n\n", fontsize=size)  # room for three lines
    ax.legend(handles=[Patch(color=GREY, alpha=0.4, label="temperature alone"),
                       Patch(color=BLUE, label="after top-k, top-p: drawn from")],
              loc="upper right", fontsize=size - 1, frameon=False)
    grey = ax.bar(range(n_bars), [0.0] * n_bars, width=0.8, color=GREY, alpha=0.4,
                  animated=True)
    blue = ax.bar(range(n_bars), [0.0] * n_bars, width=0.5, color=BLUE, animated=True)
    text_ax.axis("off")
    text_ax.set_title(f"continued with this rule (seed {seed}):", fontsize=size,
                      loc="left")
    text = text_ax.text(0, 1, "\n" * (n_lines - 1), va="top", ha="left",
                        family="monospace", fontsize=size - 1, animated=True,
                        parse_math=False, transform=text_ax.transAxes)

    def draw(j: int) -> list[Artist]:
        before, after = _sampling_bars(logits, rules[j])
        for bar, height in zip(grey, before[order].tolist()):
            bar.set_height(height)
        for bar, height in zip(blue, after[order].tolist()):
            bar.set_height(height)
        kept = f"{int((after > 0).sum())} of {len(chars)} characters kept"
        if rules[j][0] == 0:
            kept += "\n(top-k and top-p change nothing)" if narrow else (
                ": top-k and top-p change nothing")
        ax.set_title(f"{_rule_name(rules[j])}\n{kept}", fontsize=size)
        text.set_text(_continuation_text(prompt, continuations[j], columns, n_lines))
        return [*grey, *blue, ax.title, text]

    return _render_frames(fig, len(rules), draw)


def _check_choices(temperatures: Sequence[float], top_ks: Sequence[int | None],
                   top_ps: Sequence[float | None], vocab_size: int) -> None:
    """Raise a ValueError naming the values unless each list holds 2 or more distinct, valid
    choices (so at least one temperature is above 0)."""
    for name, values in (("temperatures", temperatures), ("top_ks", top_ks),
                         ("top_ps", top_ps)):
        if len(values) < 2 or len(set(values)) != len(values):
            raise ValueError(f"{name} must hold 2 or more distinct values, got {list(values)}")
    for temperature in temperatures:
        check_sampling(temperature, None, None, vocab_size)
    for top_k in top_ks:
        check_sampling(1.0, top_k, None, vocab_size)
    for top_p in top_ps:
        check_sampling(1.0, None, top_p, vocab_size)


def _selection(name: str, values: Sequence, start: int) -> widgets.SelectionSlider:
    """A slider over ``values`` (None shown as "off", temperature 0 as "greedy")."""
    def label(v) -> str:
        if v is None:
            return "off"
        return "greedy" if name == "temperature" and v == 0 else str(v)

    return widgets.SelectionSlider(options=[(label(v), i) for i, v in enumerate(values)],
                                   index=start, description=name,
                                   style={"description_width": "96px"})  # "temperature" whole


@torch.no_grad()
def _draw_each(model: Decoder, tokenizer: CharTokenizer, prompt: str, n_new: int,
               rules: list[Rule], seed: int) -> dict[Rule, str]:
    """The ``n_new`` characters each rule ``(temperature, top_k, top_p)`` draws after
    ``prompt``: what :func:`~transformer_lib.text.generate_text` with ``seed`` adds, for all
    the rules at once, one row each (one forward pass per step, not one per rule and step).
    Each row has its own generator, seeded by ``seed``, and its own rule."""
    device = model.embed_tokens.weight.device
    prompt_ids = tokenizer.encode(prompt).to(device)  # (P,)
    tokens = prompt_ids[None].expand(len(rules), -1)  # (R, P): one row per rule
    generators = [torch.Generator(device=device).manual_seed(seed) for _ in rules]
    cache = model.new_cache(len(rules), len(prompt_ids) + n_new)
    logits = model(tokens, cache)[:, -1]  # (R, V)
    steps = []
    for step in range(n_new):
        next_ids = torch.cat([
            sample_next_token(logits[r:r + 1], temperature=t, top_k=k, top_p=p, generator=g)
            for r, ((t, k, p), g) in enumerate(zip(rules, generators))])  # (R, 1)
        steps.append(next_ids)
        if step < n_new - 1:
            logits = model(next_ids, cache)[:, -1]  # (R, V)
    drawn = torch.cat(steps, dim=1)  # (R, n_new)
    return {rule: tokenizer.decode(row) for rule, row in zip(rules, drawn)}


def sampling_explorer(model: Decoder | None = None, tokenizer: CharTokenizer | None = None, *,
                      prompt: str = PROMPT, temperatures: Sequence[float] = TEMPERATURES,
                      top_ks: Sequence[int | None] = TOP_KS,
                      top_ps: Sequence[float | None] = TOP_PS, n_new: int = 80,
                      seed: int = 0) -> SamplingExplorer:
    """Explore greedy decoding, temperature, top-k and top-p on a character model, with or
    without a kernel.

    Args:
        model, tokenizer: a trained character model and its tokenizer; both None (the
            default) loads the bundled ``tiny_lm.pt`` with
            :func:`~transformer_lib.text.load_text_model`.
        prompt: the text to continue.
        temperatures, top_ks, top_ps: the choices of each control (None: no top-k or top-p
            cut; temperature 0: greedy). The temperature starts at the choice nearest 1.
        n_new: characters sampled after the prompt for each rule.
        seed: the seed of every draw (:func:`~transformer_lib.text.generate_text`), the same for
            every rule.

    Returns:
        A :class:`SamplingExplorer` (a VBox, shown as the widget) with SelectionSliders
        ``temperature``, ``top_k`` and ``top_p`` (their ``index`` picks the frame) over
        ``len(temperatures) × len(top_ks) × len(top_ps)`` precomputed frames
        (``pictures["sampling"]``).
    """
    if (model is None) != (tokenizer is None):
        raise ValueError("give both model and tokenizer, or neither (the bundled model)")
    if model is None:
        model, tokenizer, _ = load_text_model()
    if not prompt or n_new < 1:
        raise ValueError(f"prompt must be non-empty and n_new >= 1, got {prompt!r}, {n_new}")
    _check_choices(temperatures, top_ks, top_ps, tokenizer.vocab_size)
    _check_frames("sampling_explorer", {"temperatures": len(temperatures),
                                        "top-k values": len(top_ks),
                                        "top-p values": len(top_ps)})
    with torch.no_grad():
        logits = model(tokenizer.encode(prompt)[None])[0, -1]  # (V,): the next character
    rules = [(t, k, p) for t in temperatures for k in top_ks for p in top_ps]
    # Greedy draws once: top-k and top-p change nothing there.
    distinct = list(dict.fromkeys((0.0, None, None) if r[0] == 0 else r for r in rules))
    drawn = _draw_each(model, tokenizer, prompt, n_new, distinct, seed)
    texts = {(t, k, p): drawn[(0.0, None, None) if t == 0 else (t, k, p)] for t, k, p in rules}
    K, P = len(top_ks), len(top_ps)

    def frames(narrow: bool) -> list:  # [temperature][top_k][top_p]
        flat = _sampling_frames(logits, tokenizer.chars, prompt, rules,
                                [texts[r] for r in rules], seed, narrow)
        return [[Frames(flat[(i * K + j) * P:(i * K + j + 1) * P], flat.text_px)
                 for j in range(K)] for i in range(len(temperatures))]

    start = min(range(len(temperatures)), key=lambda i: abs(temperatures[i] - 1.0))
    controls = {"temperature": _selection("temperature", temperatures, start),
                "top_k": _selection("top-k", top_ks, 0),
                "top_p": _selection("top-p", top_ps, 0)}
    picture, narrow, links = _picture_sets(frames, [(c, "index") for c in controls.values()])
    caption = widgets.HTML(
        f"<b>Sampling the next character.</b> Bars: the probabilities of the model's "
        f"{min(N_BARS, tokenizer.vocab_size)} most likely characters after "
        f"“{html.escape(prompt).replace(chr(10), '↵')}”, grey at the chosen temperature "
        f"alone, blue after top-k and top-p have cut the rest and the kept ones are "
        f"renormalised (what a draw picks from; ␣ is a space, ↵ a line break). Below: {n_new} "
        f"characters drawn with the same rule and seed {seed}. All pictures are precomputed.")
    shown = [p for p in (picture, narrow) if p is not None]  # wide, or narrow on a phone
    return SamplingExplorer([caption, _control_row(*controls.values()), *shown],
                            controls=controls, pictures={"sampling": picture},
                            narrow={"sampling": narrow}, links=links,
                            prompt=prompt, logits=logits, continuations=texts)
