"""The KV-cache memory explorer of chapter 7: text frames, one per combination of the model, its
key/value heads, the context and the cache's dtype, whose numbers agree with the cache formula
written out here, with ``KVCache`` and with the library's ``Decoder`` built on the meta device."""
import json
import re

import ipywidgets as widgets
import pytest
import torch
from ipywidgets.embed import dependency_state, embed_data
from ipywidgets.widgets.widget_link import Link
from widget_support import every_model, stacks_by_depth, text_frames

from transformer_lib import widgets as W
from transformer_lib.cache import KVCache
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.widgets.kv_memory import _cache_bytes, _kv_memory_frame, _weight_bytes

# Draws figures or explorer frames, seconds of CPU each: `make test` runs them, `make check` not.
pytestmark = pytest.mark.figures

MODELS, KV, CONTEXTS, DTYPES = list(W.KV_PRESETS), list(W.KV_HEAD_CHOICES), list(W.KV_CONTEXTS), \
    list(W.KV_DTYPES)
PUBLISHED = {"Llama 3.2 1B": 1_235_814_400, "Llama 2 7B": 6_738_415_616,
             "Llama 3 8B": 8_030_261_248, "Llama 3 70B": 70_553_706_496}  # model cards


@pytest.fixture(scope="module")
def explorer():
    return W.kv_memory_explorer()


def _formula(name: str, n_kv: int, context: int, dtype: str) -> int:
    """2 · n_layers · n_kv · d_head · T · bytes per value: the chapter's formula, batch 1."""
    p = W.KV_PRESETS[name]
    return 2 * p["n_layers"] * n_kv * (p["d_model"] // p["n_heads"]) * context \
        * torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _meta_parameters(name: str, n_kv: int) -> int:
    """Parameters of the library's Decoder with this shape, built on the meta device."""
    with torch.device("meta"):
        model = Decoder(DecoderConfig(max_seq_len=8, **{**W.KV_PRESETS[name],
                                                         "n_kv_heads": n_kv}))
    return sum(p.numel() for p in model.parameters())


def _gb_shown(frame: str) -> list[float]:
    """The amounts the bars of a frame print, in bytes: weights, then cache."""
    found = re.findall(r">([\d,.]+) (GB|MB)</span>", frame)
    return [float(x.replace(",", "")) * (1e9 if unit == "GB" else 1e6) for x, unit in found]


def test_one_text_frame_per_combination_every_stack_linked(explorer):
    c = explorer.controls
    assert [label for label, _ in c["model"].options] == MODELS
    assert [h for _, h in c["kv_heads"].options] == KV
    assert [t for _, t in c["context"].options] == CONTEXTS
    assert [label for label, _ in c["dtype"].options] == DTYPES
    stack = explorer.pictures["memory"]
    leaves = text_frames(stack)
    assert len(leaves) == len(MODELS) * len(KV) * len(CONTEXTS) * len(DTYPES) == 336
    shown = [leaf.value for leaf in leaves if "cannot have" not in leaf.value]
    assert len(set(shown)) == len(shown) == 336 - 3 * 7 * 3  # no two possible settings alike
    assert len(explorer.table) == len(leaves)
    order = [c["model"], c["kv_heads"], c["context"], c["dtype"]]
    by_depth = stacks_by_depth(stack)
    assert len(by_depth) == 4 and len(explorer.links) == 1 + 4 + 4 * 4 + 4 * 4 * 7
    for depth, stacks in by_depth.items():
        for s in stacks:
            found = [link for link in explorer.links if link.target == (s, "selected_index")]
            assert len(found) == 1 and found[0].source == (order[depth], "index")
            assert s.selected_index == order[depth].index  # the frame the controls show


@pytest.mark.parametrize("name, n_kv, context, dtype", [
    ("Llama 3 8B", 8, 32768, "bfloat16"), ("Llama 2 7B", 32, 4096, "bfloat16"),
    ("Llama 3 70B", 64, 131072, "float32"), ("Llama 3.2 1B", 1, 2048, "float8_e4m3fn")])
def test_frames_show_the_formula_the_cache_and_the_weights(explorer, name, n_kv, context, dtype):
    """The frame the Stacks hold for a setting is what the renderer draws for it, and the bytes
    behind it are the formula, KVCache.nbytes and the meta Decoder's parameters × 2."""
    index = MODELS.index(name), KV.index(n_kv), CONTEXTS.index(context), DTYPES.index(dtype)
    leaf = explorer.pictures["memory"]
    for i in index:
        leaf = leaf.children[i]
    assert leaf.value == _kv_memory_frame(name, n_kv, context, dtype, 80.0)
    weights, cache = explorer.table[name, n_kv, context, dtype]
    p = W.KV_PRESETS[name]
    kv = KVCache(p["n_layers"], 1, n_kv, context, p["d_model"] // p["n_heads"],
                 dtype=getattr(torch, dtype), device="meta")
    assert cache == kv.nbytes == _formula(name, n_kv, context, dtype)
    assert weights == 2 * _meta_parameters(name, n_kv)  # bfloat16
    shown = _gb_shown(leaf.value)
    assert len(shown) == 2
    for printed, exact in zip(shown, (weights, cache)):
        assert abs(printed - exact) <= 0.006e9 if exact >= 1e8 else abs(printed / exact - 1) < 0.01
    assert f"{context:,} tokens in {dtype}" in leaf.value
    assert f"× {p['n_layers']} layers × {n_kv} head{'s' if n_kv > 1 else ''} ×" in leaf.value
    assert f"cache ÷ weights {cache / weights:.3g};" in leaf.value


def test_the_chapters_numbers(explorer):
    """The chapter's table: Llama 2 7B's MHA cache is 2.15 GB at 4k tokens and 17.18 GB at 32k
    in bfloat16, its weights 13.48 GB; 8 KV heads quarter the cache exactly. Then what the
    sentence before the explorer says the reader sees, move by move."""
    t = explorer.table
    assert t["Llama 2 7B", 32, 4096, "bfloat16"] == (13_476_831_232, 2_147_483_648)
    assert t["Llama 2 7B", 32, 32768, "bfloat16"][1] == 17_179_869_184
    assert 4 * t["Llama 2 7B", 8, 32768, "bfloat16"][1] == t["Llama 2 7B", 32, 32768,
                                                               "bfloat16"][1]
    assert t["Llama 3 8B", 8, 32768, "float32"][1] == 2 * t["Llama 3 8B", 8, 32768,
                                                             "bfloat16"][1]
    frame = _kv_memory_frame("Llama 3 8B", 8, 32768, "bfloat16", 80.0)
    assert "16.06 GB" in frame and "4.29 GB" in frame and "131 kB per token" in frame
    assert "80 GB hold the weights and 14 such sequences" in frame  # (80 - 16.06) // 4.29
    mha = _kv_memory_frame("Llama 3 8B", 32, 32768, "bfloat16", 80.0)  # KV heads moved to 32
    assert "17.67 GB" in mha and "17.18 GB" in mha and "weights and 3 such sequences" in mha
    long = _kv_memory_frame("Llama 3 8B", 32, 131072, "bfloat16", 80.0)  # then context 128k
    assert "68.72 GB" in long and "but not one such sequence" in long
    small = t["Llama 3.2 1B", 8, 131072, "bfloat16"]
    assert small[1] > small[0]  # the cache outgrows the weights
    assert all(t["Llama 3 70B", h, c, d][0] > 80e9 for h in KV for c in CONTEXTS for d in DTYPES)
    assert all(2 * t[m, h, c, "float8_e4m3fn"][1] == t[m, h, c, "bfloat16"][1]
               for m, h, c, d in t if t[m, h, c, d] is not None)


@pytest.mark.parametrize("name", MODELS)
def test_weights_are_the_decoders_parameters(name):
    """For every key/value head count the model allows: the hand count of the explorer is the
    parameter count of the library's Decoder; with the published heads, the model card's."""
    p = W.KV_PRESETS[name]
    assert _weight_bytes(name, p["n_kv_heads"]) == 2 * PUBLISHED[name]
    for n_kv in (1, p["n_heads"]):
        assert _weight_bytes(name, n_kv) == 2 * _meta_parameters(name, n_kv)


def test_impossible_head_counts_say_why(explorer):
    """A 32-head model cannot have 64 key/value heads: the frame says so, with no numbers."""
    for name in ("Llama 3.2 1B", "Llama 2 7B", "Llama 3 8B"):
        assert all(explorer.table[name, 64, t, d] is None for t in CONTEXTS for d in DTYPES)
        frame = _kv_memory_frame(name, 64, 4096, "bfloat16", 80.0)
        assert "cannot have 64 key/value heads" in frame and "must divide 32" in frame
        assert "GB" not in frame
    assert explorer.table["Llama 3 70B", 64, 4096, "bfloat16"] is not None
    assert sum(v is None for v in explorer.table.values()) == 3 * 7 * 3


def test_what_fits_in_the_budget():
    assert "the weights alone exceed 80 GB" in _kv_memory_frame(
        "Llama 3 70B", 8, 4096, "bfloat16", 80.0)
    assert "but not one such sequence" in _kv_memory_frame(
        "Llama 2 7B", 32, 131072, "float32", 80.0)  # 137 GB of cache
    weights, cache = _weight_bytes("Llama 3.2 1B", 8), _cache_bytes(
        "Llama 3.2 1B", 8, 8192, "bfloat16")
    expected = int((20e9 - weights) // cache)
    assert f"20 GB hold the weights and {expected:,} such" in _kv_memory_frame(
        "Llama 3.2 1B", 8, 8192, "bfloat16", 20.0)


def test_controls_wrap_move_by_keyboard_and_start_inside_their_range(explorer):
    """Sliders and dropdowns with accessible names, laid out as the other explorers'; each
    starts on a setting from which ArrowRight moves it (the browser test presses it)."""
    controls = list(explorer.controls.values())
    row = explorer.children[1]
    assert list(row.children) == controls and row.layout.flex_flow == "row wrap"
    for control in controls:
        assert isinstance(control, (widgets.IntSlider, widgets.SelectionSlider, widgets.Dropdown))
        assert control.layout.flex == f"1 1 {W.CONTROL_WIDTH}"
        assert control.layout.max_width == W.CONTROL_MAX_WIDTH and control.description
        assert 0 <= control.index < len(control.options) - 1
    c = explorer.controls
    assert (c["model"].label, c["kv_heads"].value, c["context"].value, c["dtype"].label) == (
        "Llama 3 8B", 8, 32768, "bfloat16")
    assert isinstance(explorer, W.KvMemoryExplorer) and isinstance(explorer, W.Explorer)


def test_text_frames_share_one_layout_and_style_and_the_page_stays_light(explorer):
    """Leaves share their Layout and style models; the whole widget state, as the book embeds
    it, stays under 1.5 MB."""
    leaves = text_frames(explorer)
    assert len({id(leaf.layout) for leaf in leaves}) == 1
    assert len({id(leaf.style) for leaf in leaves}) == 1
    state = embed_data(views=[explorer], state=dependency_state(explorer))["manager_state"]
    size = len(json.dumps(state))
    assert size < 1.5e6, f"the explorer adds {size / 1e6:.2f} MB to its page"


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"models must be some of .*got \['GPT-5'\]"):
        W.kv_memory_explorer(models=["GPT-5"])
    with pytest.raises(ValueError, match=r"kv_heads must be positive integers, got \[0, 8\]"):
        W.kv_memory_explorer(kv_heads=[0, 8])
    with pytest.raises(ValueError, match=r"contexts must be positive integers, got \[4096.5\]"):
        W.kv_memory_explorer(contexts=[4096.5])
    with pytest.raises(ValueError, match=r"dtypes must name floating-point .*got \['int4'\]"):
        W.kv_memory_explorer(dtypes=["int4"])  # torch.int4.itemsize is 1: not its size
    with pytest.raises(ValueError, match=r"got \['float16', 'float4_e2m1fn_x2'\]"):
        W.kv_memory_explorer(dtypes=["float16", "float4_e2m1fn_x2"])
    with pytest.raises(ValueError, match=r"got \['float', 'nonsense'\]"):
        W.kv_memory_explorer(dtypes=["float", "nonsense"])
    with pytest.raises(ValueError, match=r"budget_gb must be > 0, got 0"):
        W.kv_memory_explorer(budget_gb=0)
    with pytest.raises(ValueError, match=r"= 672 frames"):  # 4 × 4 × 14 × 3
        W.kv_memory_explorer(contexts=[1024 * (i + 1) for i in range(14)])


# Without Stack (ipywidgets 7, Colab): one HTML, updated through the kernel -------------------


@pytest.fixture
def kernel_path(monkeypatch):
    monkeypatch.setattr(W.frames, "HAS_STACK", False)


def test_kernel_path_moves_the_text_to_the_chosen_frame(kernel_path, explorer):
    """Each control moved in the kernel changes the one HTML picture, to the frame the static
    book's Stacks hold for the same setting; no Stack, no link."""
    box = W.kv_memory_explorer()
    picture = box.pictures["memory"]
    assert isinstance(picture, widgets.HTML) and W.frames.FRAME_CLASS in picture._dom_classes
    assert box.links == [] and not any(isinstance(w, (widgets.Stack, Link))
                                       for w in every_model(box))
    for name in ("model", "kv_heads", "context", "dtype"):
        before = picture.value
        box.controls[name].index += 1
        assert picture.value != before, f"moving {name} changed nothing"
        leaf = explorer.pictures["memory"]
        for control in box.controls.values():
            leaf = leaf.children[control.index]
        assert picture.value == leaf.value


def test_the_colab_probe_sees_the_text_change(kernel_path):
    """The Colab-like test's probe (its own code) reads the text frame as a picture."""
    from test_colab import PROBE

    namespace: dict = {}
    exec(PROBE.split("_report = []")[0], namespace)  # the probe's _pictures, nothing run
    box = W.kv_memory_explorer()
    before = namespace["_pictures"](box)
    assert box.pictures["memory"].value in before
    box.controls["context"].index = 0
    assert namespace["_pictures"](box) != before
