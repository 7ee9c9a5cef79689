"""The drawn diagrams of ``transformer_lib/plotting/diagrams.py``: what each box and line
stands for, read back from the patches' gids and texts."""
import matplotlib

matplotlib.use("Agg")  # no windows; must come before pyplot is imported

import matplotlib.pyplot as plt
import pytest
import torch

from transformer_lib.attention import repeat_kv
from transformer_lib.plotting import (
    FIGURE_WIDTH,
    gqa_heads,
    layer_structures,
    norm_placement,
    phone_text_px,
    rope_pairings,
    speculative_steps,
    state_and_cache,
)
from transformer_lib.positional import pair_channels

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _gids(ax) -> list[str]:
    return [p.get_gid() for p in ax.patches if p.get_gid()]


def _min_text_px(fig, ax) -> float:
    return min(phone_text_px(t.get_fontsize(), fig.get_figwidth()) for t in ax.texts)


def test_layer_structures_draw_the_three_layers_and_their_residual_paths():
    fig, ax = layer_structures()
    gids = _gids(ax)
    titles = {t.get_text() for t in ax.texts}
    assert {"2017 encoder layer", "2017 decoder layer", "decoder-only block"} <= titles
    encoder = [g for g in gids if g.startswith("2017 encoder layer: ")]
    decoder = [g for g in gids if g.startswith("2017 decoder layer: ")]
    modern = [g for g in gids if g.startswith("decoder-only block: ")]
    # post-norm: each sublayer followed by add & LayerNorm; only the 2017 decoder cross-attends
    assert sum("add & LayerNorm" in g for g in encoder) == 2
    assert sum("add & LayerNorm" in g for g in decoder) == 3
    assert any("cross-attention" in g for g in decoder)
    assert not any("cross" in g for g in encoder + modern)
    # pre-norm: an RMSNorm before each sublayer, residual sums after, no LayerNorm
    assert sum(g.endswith(": RMSNorm") for g in modern) == 2
    assert sum(g.endswith(": +") for g in modern) == 2
    assert not any("LayerNorm" in g for g in modern)
    # the residual paths skip the sublayer: into the add & norm (post), the sum (pre)
    assert {g for g in encoder if "residual" in g} == {
        "2017 encoder layer: residual 0->1", "2017 encoder layer: residual 2->3"}
    assert {g for g in modern if "residual" in g} == {
        "decoder-only block: residual 0->2", "decoder-only block: residual 3->5"}
    assert "encoder output" in gids
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9  # readable on a phone


@pytest.mark.parametrize("n_heads, n_kv_heads", [(8, 2), (4, 4), (6, 1), (16, 8)])
def test_gqa_heads_connects_each_query_head_to_the_head_repeat_kv_gives_it(n_heads, n_kv_heads):
    fig, ax = gqa_heads(n_heads, n_kv_heads)
    lines = {g for g in _gids(ax) if "->" in g}
    kv_index = torch.arange(n_kv_heads, dtype=torch.float32).view(1, n_kv_heads, 1, 1)
    served = repeat_kv(kv_index, n_heads // n_kv_heads).flatten().long().tolist()  # (H,)
    assert lines == {f"q{h}->kv{j}" for h, j in enumerate(served)}
    assert {g for g in _gids(ax) if g.startswith("kv") and "->" not in g} == {
        f"kv{j}" for j in range(n_kv_heads)}
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9


@pytest.mark.parametrize("n_heads, n_kv_heads", [(8, 3), (0, 1), (32, 8), (4, 0)])
def test_gqa_heads_rejects_sizes_it_cannot_draw(n_heads, n_kv_heads):
    with pytest.raises(ValueError, match=rf"n_heads \({n_heads}\).*n_kv_heads \({n_kv_heads}\)"):
        gqa_heads(n_heads, n_kv_heads)


def test_attention_flow_draws_one_head_with_its_shapes():
    from transformer_lib.plotting import attention_flow

    fig, ax = attention_flow()
    gids = set(_gids(ax))
    assert {"X", "Q", "K", "V", "scores", "weights", "out"} <= gids
    assert {"X->Q", "X->K", "X->V", "Q->scores", "K->scores", "scores->weights",
            "weights->out", "V->out"} <= gids
    # causal: the 6 cells above the diagonal of the 4 x 4 weights are blocked, the rest drawn
    assert {g for g in gids if g.startswith("blocked")} == {
        f"blocked {i},{j}" for i in range(4) for j in range(4) if j > i}
    texts = {t.get_text() for t in ax.texts}
    assert {"(T, C)", "(T, D)", "(S, D)", "(T, S)"} <= texts
    assert fig.get_figwidth() <= FIGURE_WIDTH and _min_text_px(fig, ax) >= 9
    _, ax = attention_flow(causal=False)
    assert not [g for g in _gids(ax) if g.startswith("blocked")]


@pytest.mark.parametrize("n_heads", [2, 4, 6])
def test_head_split_flow_keeps_each_heads_channels_in_their_place(n_heads):
    """Head h's channels before the split and after the merge are the same slice of C, in the
    same colour, and each head has a slab before and after attention."""
    from transformer_lib.plotting import head_split_flow

    fig, ax = head_split_flow(n_heads=n_heads)
    patches = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    for h in range(n_heads):
        before, after = patches[f"Q channels {h}"], patches[f"merged channels {h}"]
        assert before.get_facecolor() == after.get_facecolor()
        assert before.get_width() == after.get_width()
        assert before.get_x() - patches["Q channels 0"].get_x() == pytest.approx(
            after.get_x() - patches["merged channels 0"].get_x())
        assert f"head {h}" in patches and f"head {h} out" in patches
    colours = {patches[f"Q channels {h}"].get_facecolor() for h in range(n_heads)}
    assert len(colours) == n_heads  # every head its own colour
    assert fig.get_figwidth() <= FIGURE_WIDTH and _min_text_px(fig, ax) >= 9
    with pytest.raises(ValueError, match="n_heads"):
        head_split_flow(n_heads=7)


def test_encoder_decoder_flow_feeds_the_memory_into_cross_attention_as_keys_and_values():
    from transformer_lib.plotting import encoder_decoder_flow

    fig, ax = encoder_decoder_flow()
    patches = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    kv, q = patches["memory->cross K, V"], patches["decoder->cross Q"]
    memory, cross = patches["memory"], patches["cross-attention"]
    start, end = kv.get_path().vertices[0], kv.get_path().vertices[-1]
    # K, V leave the memory's right edge and end at the cross-attention's left edge
    assert start[0] == pytest.approx(memory.get_x() + memory.get_width(), abs=0.1)
    assert end[0] <= cross.get_x() + 0.05
    assert q.get_path().vertices[-1][1] <= cross.get_y() + 0.05  # Q comes from below
    assert fig.get_figwidth() <= FIGURE_WIDTH and _min_text_px(fig, ax) >= 9


def test_norm_placement_puts_the_norm_after_the_sum_or_before_the_sublayer():
    fig, ax = norm_placement()
    gids = _gids(ax)
    post = [g.split(": ", 1)[1] for g in gids if g.startswith("post-norm (2017): ")]
    pre = [g.split(": ", 1)[1] for g in gids if g.startswith("pre-norm (since): ")]
    # bottom to top: post-norm normalises the sum, pre-norm the sublayer's input only
    assert post == ["sublayer", "+", "LayerNorm", "residual 0->1"]
    assert pre == ["LayerNorm", "sublayer", "+", "residual 0->2"]
    ys = {g: p.get_center()[1] if hasattr(p, "get_center") else p.get_y()
          for p in ax.patches if (g := p.get_gid()) and "residual" not in g}
    assert ys["post-norm (2017): +"] < ys["post-norm (2017): LayerNorm"]
    assert ys["pre-norm (since): LayerNorm"] < ys["pre-norm (since): sublayer"]
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9


@pytest.mark.parametrize("n_draft, n_accepted", [(4, 2), (3, 0), (3, 3), (1, 1)])
def test_speculative_steps_keep_the_accepted_drafts_then_one_token_of_the_large_model(
        n_draft, n_accepted):
    fig, ax = speculative_steps(n_draft, n_accepted)
    gids = set(_gids(ax))
    assert {f"draft {i}" for i in range(n_draft)} <= gids and "verify" in gids
    kept = {g for g in gids if g.startswith("keep ")}
    dropped = {g for g in gids if g.startswith("drop ")}
    new = {g for g in gids if g.startswith("resample ") or g == "bonus"}
    assert kept == {f"keep {i}" for i in range(n_accepted)}
    assert dropped == {f"drop {i}" for i in range(n_accepted + 1, n_draft)}
    assert len(new) == 1  # every round emits n_accepted + 1 tokens
    assert any(t.get_text().endswith(f"round: {n_accepted + 1}") for t in ax.texts)
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9


@pytest.mark.parametrize("n_draft, n_accepted", [(0, 0), (7, 1), (3, 4), (3, -1)])
def test_speculative_steps_rejects_counts_it_cannot_draw(n_draft, n_accepted):
    with pytest.raises(ValueError, match="n_draft"):
        speculative_steps(n_draft, n_accepted)


def test_state_and_cache_grow_the_cache_by_one_row_per_token_and_keep_the_state():
    n = 5
    fig, ax = state_and_cache(n)
    rows = {t: sum(1 for g in _gids(ax) if g.startswith(f"cache {t} row ")) for t in range(1, n + 1)}
    assert rows == {t: t for t in range(1, n + 1)}  # (t, D) after t tokens
    states = [p for p in ax.patches if (p.get_gid() or "").startswith("state ")
              and "->" not in p.get_gid()]
    assert len(states) == n
    assert len({(round(p.get_width(), 9), round(p.get_height(), 9)) for p in states}) == 1
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("(D, D)") == n and "(5, D)" in labels
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9
    with pytest.raises(ValueError, match="n_steps"):
        state_and_cache(1)


@pytest.mark.parametrize("head_dim", [2, 8, 12])
def test_rope_pairings_join_the_channels_pair_channels_pairs(head_dim):
    fig, ax = rope_pairings(head_dim)
    boxes = {p.get_gid(): p for p in ax.patches if " channel " in (p.get_gid() or "")}
    arcs = {p.get_gid(): p for p in ax.patches if " pair " in (p.get_gid() or "")}
    for pairing in ("interleaved", "half"):
        assert {g for g in boxes if g.startswith(pairing)} == {
            f"{pairing} channel {c}" for c in range(head_dim)}
        for i in range(head_dim // 2):
            a, b = pair_channels(i, head_dim, pairing)
            arc = arcs[f"{pairing} pair {i}"]
            ends = sorted(round(x - 2.6) for x, _ in (arc._posA_posB or []))
            assert ends == [a, b]  # the arc joins the two channels of the pair
            first, second = boxes[f"{pairing} channel {a}"], boxes[f"{pairing} channel {b}"]
            assert tuple(first.get_facecolor()) == tuple(second.get_facecolor())
    assert fig.get_figwidth() <= FIGURE_WIDTH
    assert _min_text_px(fig, ax) >= 9
    with pytest.raises(ValueError, match="head_dim"):
        rope_pairings(7)
