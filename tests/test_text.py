"""The bundled text, the character tokenizer, next-token batches, the training loop and the
saved checkpoint and sweep (``transformer_lib/text.py``)."""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import transformer_lib.text as text_module
from transformer_lib.decoder import Decoder, DecoderConfig
from transformer_lib.ffn import FeedForward, SwiGLU
from transformer_lib.norms import LayerNorm, RMSNorm
from transformer_lib.resources import data_file
from transformer_lib.text import (
    CharTokenizer,
    evaluate_loss,
    generate_text,
    load_ffn_norm_ablation,
    load_kv_heads_sweep,
    load_text,
    load_text_model,
    next_token_batch,
    save_text_model,
    split_ids,
    text_config,
    train_text_model,
)

MAX_CHECKPOINT_BYTES = 5_000_000


@pytest.fixture(scope="module")
def text():
    return load_text()


@pytest.fixture(scope="module")
def tokenizer(text):
    return CharTokenizer.from_text(text)


@pytest.fixture(scope="module")
def ids(text, tokenizer):
    return tokenizer.encode(text)


def tiny_config(vocab_size: int, **overrides) -> DecoderConfig:
    return text_config(vocab_size, **{"d_model": 32, "n_layers": 1, "n_heads": 2,
                                      "n_kv_heads": 1, "d_ff": 86, "max_seq_len": 64,
                                      **overrides})


# The bundled text ---------------------------------------------------------------------------


def test_bundled_text_is_a_few_hundred_kb_of_plays(text):
    assert 200_000 < len(text.encode("utf-8")) < 400_000
    assert text.isascii()
    for title in ("MACBETH", "JULIUS CAESAR", "TWELFTH NIGHT"):
        assert title in text
    assert "Gutenberg" not in text  # only the plays, no editions' notices


def test_data_readme_states_source_and_licence():
    readme = data_file("README.md").read_text(encoding="utf-8")
    for fact in ("shakespeare.txt", "public domain", "tiny_lm.pt", "kv_heads_sweep.json",
                 "bench/train_text_model.py", "ffn_norm_ablation.json",
                 "bench/ffn_norm_ablation.py"):
        assert fact in readme


def test_unknown_data_file_is_a_value_error_naming_the_files():
    with pytest.raises(ValueError, match=r"no bundled data file 'hamlet.txt'.*shakespeare\.txt"):
        load_text("hamlet.txt")


# The tokenizer ------------------------------------------------------------------------------


def test_tokenizer_round_trip_on_the_whole_text(text, tokenizer, ids):
    assert tokenizer.vocab_size == len(set(text)) == 69
    assert list(tokenizer.chars) == sorted(tokenizer.chars)
    assert ids.dtype == torch.long and ids.shape == (len(text),)
    assert int(ids.min()) == 0 and int(ids.max()) == tokenizer.vocab_size - 1
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids.tolist()[:50]) == text[:50]


def test_tokenizer_ids_are_positions_in_its_characters():
    tok = CharTokenizer("ab c")
    assert tok.encode("c a").tolist() == [3, 2, 0]
    assert tok.decode([1, 1, 0]) == "bba"
    assert CharTokenizer.from_text("banana").chars == "abn"
    wide = CharTokenizer("aé😀")  # any characters, not only ASCII
    assert wide.encode("😀aé").tolist() == [2, 0, 1] and wide.decode([1, 2]) == "é😀"
    assert wide.encode("").shape == (0,) and wide.decode([]) == ""


@pytest.mark.parametrize("make, message", [
    (lambda: CharTokenizer("aba"), r"must not repeat a character, got \['a'\]"),
    (lambda: CharTokenizer(""), "non-empty string"),
    (lambda: CharTokenizer("abc").encode("cab!"), r"character '!' at position 3 is not in the "
                                                  r"vocabulary \(3 characters\)"),
    (lambda: CharTokenizer("abc").encode(["a"]), "text must be a string"),
    (lambda: CharTokenizer("abc").decode([0, 3]), r"integers in \[0, 2\], got 3"),
    (lambda: CharTokenizer("abc").decode(torch.zeros(2, 3, dtype=torch.long)), "not a batch"),
])
def test_tokenizer_bad_input_is_a_clear_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# Batches ------------------------------------------------------------------------------------


def test_batches_are_windows_and_targets_are_shifted_by_one():
    ids = torch.arange(100)  # each id is its own position: a window shows where it starts
    inputs, targets = next_token_batch(ids, 8, 10, torch.Generator().manual_seed(0))
    assert inputs.shape == targets.shape == (8, 10)
    starts = inputs[:, :1]  # (B, 1)
    assert torch.equal(inputs, starts + torch.arange(10))  # consecutive ids of the text
    assert torch.equal(targets, inputs + 1)  # the next token, at every position
    assert int(targets.max()) <= 99
    again, _ = next_token_batch(ids, 8, 10, torch.Generator().manual_seed(0))
    assert torch.equal(again, inputs)


def test_batches_reach_both_ends_and_leave_the_global_rng_alone():
    ids = torch.arange(12)
    state = torch.random.get_rng_state()
    gen = torch.Generator().manual_seed(1)
    firsts = {int(next_token_batch(ids, 64, 5, gen)[0][b, 0]) for b in range(64)}
    assert firsts == set(range(7))  # every start 0 ... N - T - 1
    assert torch.equal(torch.random.get_rng_state(), state)


def test_split_ids_is_contiguous(ids):
    train, val = split_ids(ids, 0.1)
    assert len(val) == round(0.1 * len(ids))
    assert torch.equal(torch.cat([train, val]), ids)


@pytest.mark.parametrize("call, message", [
    (lambda: next_token_batch(torch.arange(5), 2, 5), r"need at least that many ids, got 5"),
    (lambda: next_token_batch(torch.arange(50), 0, 5), r"batch_size \(0\) and seq_len \(5\)"),
    (lambda: next_token_batch(torch.arange(50).float(), 2, 5), "1-D LongTensor"),
    (lambda: next_token_batch(torch.arange(50)[None], 2, 5), r"shape \(1, 50\)"),
    (lambda: split_ids(torch.arange(50), 1.0), r"val_fraction must be in \(0, 1\), got 1.0"),
])
def test_batch_bad_input_is_a_clear_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# Training -----------------------------------------------------------------------------------


def test_training_lowers_the_loss_reproducibly_and_leaves_the_global_rng_alone(tokenizer, ids):
    train, val = split_ids(ids[:60_000])
    config = tiny_config(tokenizer.vocab_size)
    state = torch.random.get_rng_state()
    model, history = train_text_model(config, train, steps=60, batch_size=16, seq_len=32,
                                      lr=1e-2, warmup=5, seed=3, val_ids=val, eval_every=30)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not model.training
    assert history["step"] == list(range(1, 61)) and history["val_step"] == [30, 60]
    assert abs(history["loss"][0] - math.log(tokenizer.vocab_size)) < 0.15  # starts near ln V
    assert statistics.fmean(history["loss"][-10:]) < history["loss"][0] - 1.0
    assert history["val_loss"][-1] == pytest.approx(evaluate_loss(model, val, 32))
    assert history["lr"][4] == pytest.approx(1e-2) and history["lr"][-1] == pytest.approx(1e-3)
    assert isinstance(history["seconds"], float) and history["seconds"] > 0
    _, again = train_text_model(config, train, steps=60, batch_size=16, seq_len=32, lr=1e-2,
                                warmup=5, seed=3)
    assert again["loss"] == history["loss"]  # the same seed, the same run


@pytest.mark.parametrize("overrides, message", [
    ({"steps": 0}, r"steps \(0\), batch_size \(4\) and seq_len \(8\) must be positive"),
    ({"seq_len": 65}, r"seq_len \(65\) must be at most max_seq_len \(64\)"),
    ({"warmup": 10}, r"warmup \(10\) must be in \[0, steps - 1 = 9\]"),
    ({"lr": 0.0}, r"lr \(0.0\)"),
    ({"eval_every": 5}, "needs val_ids"),
    ({"config": "small"}, "config must be a DecoderConfig, got str"),
    ({"train_ids": torch.arange(100)}, r"train_ids holds id 99, but the model's vocab_size is 69"),
    ({"train_ids": torch.ones(100)}, "train_ids must be a 1-D LongTensor"),
    ({"ffn": "gelu"}, r"ffn \('gelu'\) must be one of \('swiglu', 'relu'\)"),
    ({"norm": "batch"}, r"norm \('batch'\) must be one of \('rms', 'layer'\)"),
])
def test_training_bad_input_is_a_clear_value_error(tokenizer, ids, overrides, message):
    args = {"config": tiny_config(tokenizer.vocab_size), "train_ids": ids[:1000], "steps": 10,
            "batch_size": 4, "seq_len": 8, "warmup": 2, **overrides}
    config, train_ids = args.pop("config"), args.pop("train_ids")
    with pytest.raises(ValueError, match=message):
        train_text_model(config, train_ids, **args)


@pytest.mark.parametrize("ffn, norm", [("relu", "rms"), ("swiglu", "layer"), ("relu", "layer")])
def test_variants_swap_only_their_parts_at_the_same_budget(tokenizer, ids, ffn, norm):
    """ReLU: a bias-free FFN of width 3/2 d_ff (SwiGLU's parameters exactly); LayerNorm in
    every norm's place (a bias of C more per norm); every other initial weight kept."""
    config = tiny_config(tokenizer.vocab_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        base = Decoder(config)
    shared = {n: t.clone() for n, t in base.state_dict().items()
              if (ffn == "swiglu" or ".mlp." not in n) and (norm == "rms" or "norm" not in n)}
    swapped = text_module._swap_parts(base, ffn, norm)
    block = swapped.layers[0]
    assert isinstance(block.mlp, FeedForward if ffn == "relu" else SwiGLU)
    assert isinstance(block.input_layernorm, LayerNorm if norm == "layer" else RMSNorm)
    assert isinstance(swapped.norm, LayerNorm if norm == "layer" else RMSNorm)
    if ffn == "relu":
        assert block.mlp.w_1.bias is None and block.mlp.w_1.weight.shape == (129, 32)
        assert abs(block.mlp.w_1.weight.std().item() - 0.02) < 0.004  # the Decoder's init
    state = swapped.state_dict()
    assert all(torch.equal(state[n], t) for n, t in shared.items())
    n_base = sum(p.numel() for p in Decoder(config).parameters())
    extra = (2 * config.n_layers + 1) * config.d_model if norm == "layer" else 0
    assert sum(p.numel() for p in swapped.parameters()) == n_base + extra
    model, history = train_text_model(config, ids[:5000], steps=3, batch_size=2, seq_len=16,
                                      warmup=1, ffn=ffn, norm=norm)
    assert isinstance(model.layers[0].mlp, FeedForward if ffn == "relu" else SwiGLU)
    assert len(history["loss"]) == 3


def test_bundled_ffn_norm_ablation_is_consistent():
    saved = load_ffn_norm_ablation()
    settings = saved["settings"]
    assert settings["relu_d_ff"] * 2 == settings["d_ff"] * 3
    assert [b["steps"] for b in saved["budgets"]] == [150, 600]
    config = text_config(settings["vocab_size"])
    n_params = sum(p.numel() for p in Decoder(config).parameters())
    for budget in saved["budgets"]:
        rows = {r["name"]: r for r in budget["variants"]}
        assert set(rows) == {"swiglu+rms", "relu+rms", "swiglu+layer", "relu+layer"}
        base = rows["swiglu+rms"]["val_loss"]
        for row in rows.values():
            assert len(row["val_loss"]) == len(row["train_loss"]) == len(settings["seeds"])
            assert row["val"]["mean"] == pytest.approx(statistics.fmean(row["val_loss"]))
            diffs = [a - b for a, b in zip(row["val_loss"], base)]
            assert row["minus_baseline"]["min"] == pytest.approx(min(diffs))
            assert row["minus_baseline"]["max"] == pytest.approx(max(diffs))
            extra = (2 * config.n_layers + 1) * config.d_model if row["norm"] == "layer" else 0
            assert row["params"] == n_params + extra
            assert 1.0 < min(row["val_loss"]) < math.log(settings["vocab_size"])
    assert json.loads(json.dumps(saved)) == saved  # plain JSON


def test_text_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match=r"unknown DecoderConfig fields: \['n_layer'\]"):
        text_config(69, n_layer=2)


def test_evaluate_loss_is_the_mean_cross_entropy_of_consecutive_windows(tokenizer, ids):
    torch.manual_seed(0)
    model = Decoder(tiny_config(tokenizer.vocab_size)).eval()
    part = ids[:1001]  # 1000 predictions: windows of 10 + 1 overlapping by one
    windows = part[:1000].view(100, 10)  # (W, T) inputs
    targets = part[1:].view(100, 10)  # (W, T)
    with torch.no_grad():
        logits = model(windows)  # (W, T, V)
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    assert evaluate_loss(model, part, seq_len=10, batch_size=7) == pytest.approx(
        expected.item(), abs=1e-5)
    # An untrained model predicts nearly uniformly: about ln V nats per character.
    assert abs(expected.item() - math.log(tokenizer.vocab_size)) < 0.05


def test_generate_text_starts_with_the_prompt(tokenizer):
    torch.manual_seed(0)
    model = Decoder(tiny_config(tokenizer.vocab_size)).eval()
    greedy = generate_text(model, tokenizer, "MACBETH.\n", 20)
    assert greedy.startswith("MACBETH.\n") and len(greedy) == 29
    assert greedy == generate_text(model, tokenizer, "MACBETH.\n", 20)
    a = generate_text(model, tokenizer, "The ", 20, temperature=1.0, seed=4)
    assert a == generate_text(model, tokenizer, "The ", 20, temperature=1.0, seed=4)
    with pytest.raises(ValueError, match="at least one character"):
        generate_text(model, tokenizer, "", 5)


def test_generate_text_passes_top_p_on(tokenizer):
    torch.manual_seed(0)
    model = Decoder(tiny_config(tokenizer.vocab_size)).eval()
    greedy = generate_text(model, tokenizer, "The ", 20)
    # a nucleus of the argmax alone: sampling at any temperature is greedy decoding
    assert generate_text(model, tokenizer, "The ", 20, temperature=2.0, top_p=1e-9) == greedy
    assert generate_text(model, tokenizer, "The ", 20, temperature=2.0, top_p=1.0,
                         seed=4) != greedy
    with pytest.raises(ValueError, match="top_p must be in"):
        generate_text(model, tokenizer, "The ", 5, temperature=1.0, top_p=2.0)


def test_batches_and_models_go_to_the_device_asked_for(tokenizer, ids):
    # "meta" tensors have shapes but no values: enough to see where things are made.
    inputs, targets = next_token_batch(ids, 4, 8, torch.Generator().manual_seed(0),
                                       device="meta")
    assert inputs.device.type == targets.device.type == "meta" and inputs.shape == (4, 8)
    on_cpu, _ = next_token_batch(ids, 4, 8, torch.Generator().manual_seed(0), device="cpu")
    default, _ = next_token_batch(ids, 4, 8, torch.Generator().manual_seed(0))
    assert torch.equal(on_cpu, default)  # the windows come from the generator alone
    config = tiny_config(tokenizer.vocab_size)
    model, history = train_text_model(config, ids[:2000], steps=2, batch_size=2, seq_len=8,
                                      warmup=1, device="cpu")
    assert model.embed_tokens.weight.device.type == "cpu" and len(history["loss"]) == 2


# Checkpoints --------------------------------------------------------------------------------


@pytest.mark.parametrize("tie", [True, False])
def test_save_and_load_give_back_the_same_model(tmp_path, tokenizer, tie):
    torch.manual_seed(0)
    model = Decoder(tiny_config(tokenizer.vocab_size, tie_embeddings=tie)).eval()
    path = tmp_path / "m.pt"
    save_text_model(path, model, tokenizer, val_loss=1.5, note="test")
    loaded, tok, info = load_text_model(path)
    assert tok.chars == tokenizer.chars and info == {"val_loss": 1.5, "note": "test"}
    assert loaded.config == model.config
    assert (loaded.lm_head.weight is loaded.embed_tokens.weight) == tie
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(loaded(tokens), model(tokens))


def test_save_refuses_a_tokenizer_of_another_size(tmp_path):
    model = Decoder(tiny_config(10))
    with pytest.raises(ValueError, match=r"vocab_size \(10\) differs from the tokenizer's \(3\)"):
        save_text_model(tmp_path / "m.pt", model, CharTokenizer("abc"))


def test_load_refuses_another_file(tmp_path, monkeypatch):
    path = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match=f"^{path} is not a text-model checkpoint of format 1"):
        load_text_model(path)
    # the bundled checkpoint is named by its file, not by the path argument (None)
    monkeypatch.setattr(text_module, "data_file", lambda name: path)
    with pytest.raises(ValueError, match="^the bundled checkpoint tiny_lm.pt is not a"):
        load_text_model()


def test_the_ablation_names_say_what_they_hold():
    """One name, one meaning: the norm kinds and the ablation file of this module are named
    apart from stability's placements and file; data_file is resources' own."""
    assert text_module.NORM_KINDS == ("rms", "layer")
    assert text_module.FFN_NORM_FILE == "ffn_norm_ablation.json"
    assert not hasattr(text_module, "NORMS") and not hasattr(text_module, "ABLATION_FILE")
    assert "data_file" not in text_module.__all__


def test_bundled_checkpoint_loads_and_reproduces_its_saved_loss(tokenizer, ids):
    path = data_file("tiny_lm.pt")
    with path.open("rb") as f:
        size = len(f.read())
    assert size <= MAX_CHECKPOINT_BYTES
    model, tok, info = load_text_model()
    assert tok.chars == tokenizer.chars  # trained on this very text
    assert model.config.n_kv_heads < model.config.n_heads  # GQA, as in the chapter
    _, val = split_ids(ids, info["val_fraction"])
    loss = evaluate_loss(model, val, info["seq_len"])
    assert loss == pytest.approx(info["val_loss"], abs=1e-4)
    assert loss < 2.0 < math.log(tok.vocab_size)  # far below the untrained ln V = 4.23
    assert info["n_params"] == sum(p.numel() for p in model.parameters())
    for key in ("steps", "batch_size", "lr", "seed", "train_seconds", "trained_on"):
        assert key in info


def test_bundled_sweep_has_every_kv_setting_and_consistent_statistics():
    sweep = load_kv_heads_sweep()
    settings, results = sweep["settings"], sweep["results"]
    assert [r["n_kv_heads"] for r in results] == [4, 2, 1]
    assert [r["name"] for r in results] == ["MHA", "GQA", "MQA"]
    assert len(settings["seeds"]) >= 2
    for r in results:
        assert len(r["val_loss"]) == len(settings["seeds"])
        assert r["mean"] == pytest.approx(statistics.fmean(r["val_loss"]))
        assert r["std"] == pytest.approx(statistics.stdev(r["val_loss"]))
        assert 1.0 < r["mean"] < math.log(settings["vocab_size"])
        config = text_config(settings["vocab_size"], n_kv_heads=r["n_kv_heads"])
        assert r["params"] == sum(p.numel() for p in Decoder(config).parameters())
    bytes_per_token = [r["kv_bytes_per_token"] for r in results]
    assert bytes_per_token[0] == 2 * bytes_per_token[1] == 4 * bytes_per_token[2]
    assert json.loads(json.dumps(sweep)) == sweep  # plain JSON


# The training script ------------------------------------------------------------------------


@pytest.mark.train
def test_training_script_writes_a_checkpoint_that_loads(tmp_path):
    """``bench/train_text_model.py`` runs as one command: two steps here instead of 1,200."""
    script = Path(__file__).resolve().parent.parent / "bench" / "train_text_model.py"
    out = tmp_path / "lm.pt"
    run = subprocess.run([sys.executable, str(script), "--steps", "2", "--threads", "1",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "training took" in run.stdout
    model, tok, info = load_text_model(out)
    assert info["steps"] == 2 and tok.vocab_size == 69
    assert model.config.n_kv_heads == 2 and model.config.tie_embeddings


@pytest.mark.train
def test_ablation_script_writes_every_variant(tmp_path):
    """``bench/ffn_norm_ablation.py`` runs as one command: 16 steps and two seeds here."""
    script = Path(__file__).resolve().parent.parent / "bench" / "ffn_norm_ablation.py"
    out = tmp_path / "ablation.json"
    run = subprocess.run([sys.executable, str(script), "--steps", "16", "--seeds", "0,1",
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert [b["steps"] for b in saved["budgets"]] == [16]
    rows = saved["budgets"][0]["variants"]
    assert [r["name"] for r in rows] == ["swiglu+rms", "relu+rms", "swiglu+layer", "relu+layer"]
    assert rows[0]["minus_baseline"] == {"mean": 0.0, "min": 0.0, "max": 0.0}
