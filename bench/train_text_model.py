"""Train the small character-level decoder that chapters 6 and 7 load, or compare MHA, GQA
and MQA at one training budget.

    python bench/train_text_model.py            # writes transformer_lib/data/tiny_lm.pt
    python bench/train_text_model.py --sweep    # writes transformer_lib/data/kv_heads_sweep.json

Both train on the bundled text (``transformer_lib/data/shakespeare.txt``: its first 90 % for
training, the last 10 % for validation) with ``transformer_lib.text.train_text_model``,
seeded, on the CPU. The checkpoint is a ``Decoder`` of ``d_model`` 128, 4 layers, 4 query
heads sharing 2 key/value heads, SwiGLU width 344 and tied embeddings (about 0.73 M
parameters, 2.9 MB in fp32), trained for 1,200 steps of 16 windows of 128 characters; its
config, its validation loss and how it was trained are stored with the weights. The sweep
trains the chapter's small model (``d_model`` 64, 2 layers, 4 query heads) with 4, 2 and 1
key/value heads, the same steps, data and seeds for each, and stores every validation loss
with the mean and standard deviation over the seeds. Both print how long they took.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from transformer_lib.decoder import Decoder
from transformer_lib.text import (
    CharTokenizer,
    evaluate_loss,
    generate_text,
    load_text,
    load_text_model,
    save_text_model,
    split_ids,
    text_config,
    train_text_model,
)

DATA = Path(__file__).resolve().parent.parent / "transformer_lib" / "data"
VAL_FRACTION = 0.1

# The checkpoint.
MODEL = dict(d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, d_ff=344, max_seq_len=512,
             tie_embeddings=True)
TRAIN = dict(steps=1200, batch_size=16, seq_len=128, lr=2e-3, warmup=60, weight_decay=0.1)

# The sweep: the chapter's model (text_config's defaults) with 4, 2 and 1 key/value heads.
SWEEP_KV_HEADS = (4, 2, 1)
SWEEP_NAMES = {4: "MHA", 2: "GQA", 1: "MQA"}
SWEEP_TRAIN = dict(steps=300, batch_size=32, seq_len=64, lr=3e-3, warmup=30)


def machine(threads: int) -> str:
    """The machine a run was measured on, as the data files record it."""
    return (f"{platform.machine()} CPU ({os.cpu_count()} cores), {threads} thread(s), "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def bundled_splits() -> tuple[CharTokenizer, list[int], list[int]]:
    """The bundled text's tokenizer, and its ids cut into training and validation parts (the
    last ``VAL_FRACTION`` of the text)."""
    text = load_text()
    tokenizer = CharTokenizer.from_text(text)
    train_ids, val_ids = split_ids(tokenizer.encode(text), VAL_FRACTION)
    return tokenizer, train_ids, val_ids


def train_checkpoint(out: Path, steps: int, seed: int, threads: int) -> None:
    tokenizer, train_ids, val_ids = bundled_splits()
    config = text_config(tokenizer.vocab_size, **MODEL)
    settings = {**TRAIN, "steps": steps, "warmup": min(TRAIN["warmup"], steps // 10)}
    n_params = sum(p.numel() for p in Decoder(config).parameters())
    print(f"training a {n_params:,}-parameter decoder for {steps} steps "
          f"({len(train_ids):,} training characters, vocabulary {tokenizer.vocab_size}) ...",
          flush=True)
    start = time.perf_counter()
    model, history = train_text_model(config, train_ids, seed=seed, val_ids=val_ids,
                                      eval_every=steps // 6, **settings)
    seconds = time.perf_counter() - start
    val_loss = evaluate_loss(model, val_ids, settings["seq_len"])
    train_loss = statistics.fmean(history["loss"][-50:])
    for step, loss in zip(history["val_step"], history["val_loss"]):
        print(f"  step {step:5d}: validation loss {loss:.3f}")
    info = {
        "text": "shakespeare.txt", "val_fraction": VAL_FRACTION, "seed": seed,
        **settings, "n_params": n_params,
        "train_loss": round(train_loss, 4),  # mean training loss of the last 50 steps
        "val_loss": val_loss,  # evaluate_loss(model, val_ids, seq_len), all of val_ids
        "val_curve": {"step": history["val_step"], "loss": history["val_loss"]},
        "train_seconds": round(seconds, 1),
        "trained_on": machine(threads),
        "date": datetime.date.today().isoformat(),
    }
    save_text_model(out, model, tokenizer, **info)
    reloaded, tok, saved = load_text_model(out)
    again = evaluate_loss(reloaded, val_ids, settings["seq_len"])
    assert abs(again - saved["val_loss"]) < 1e-5, (again, saved["val_loss"])
    print(f"validation loss {val_loss:.4f} nats/char (ln V = {math.log(tok.vocab_size):.3f}), "
          f"last training loss {train_loss:.4f}")
    print("sample:", repr(generate_text(reloaded, tok, "MACBETH.\n", 120)))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB); "
          f"training took {seconds:.0f} s on {machine(threads)}")


def run_sweep(out: Path, seeds: list[int], steps: int, threads: int) -> None:
    tokenizer, train_ids, val_ids = bundled_splits()
    settings = {**SWEEP_TRAIN, "steps": steps, "warmup": min(SWEEP_TRAIN["warmup"], steps // 10)}
    start = time.perf_counter()
    results = []
    for n_kv in SWEEP_KV_HEADS:
        config = text_config(tokenizer.vocab_size, n_kv_heads=n_kv)
        losses, seconds = [], []
        for seed in seeds:  # the same seeds, hence the same batches, for every n_kv
            model, history = train_text_model(config, train_ids, seed=seed, **settings)
            losses.append(evaluate_loss(model, val_ids, settings["seq_len"]))
            seconds.append(round(history["seconds"], 1))
            print(f"  {SWEEP_NAMES[n_kv]} (n_kv_heads={n_kv}), seed {seed}: "
                  f"validation loss {losses[-1]:.4f} ({seconds[-1]:.0f} s)", flush=True)
        results.append({
            "name": SWEEP_NAMES[n_kv], "n_kv_heads": n_kv,
            "params": sum(p.numel() for p in model.parameters()),
            # keys and values of one token: 2 · n_layers · H_kv · D numbers of 4 bytes
            "kv_bytes_per_token": 2 * config.n_layers * n_kv * config.head_dim * 4,
            "val_loss": losses, "mean": statistics.fmean(losses),
            "std": statistics.stdev(losses) if len(losses) > 1 else 0.0,
            "seconds": seconds,
        })
    base = results[0]["val_loss"]
    for r in results:  # paired by seed: the same batches and initial seed as MHA
        diffs = [a - b for a, b in zip(r["val_loss"], base)]
        r["minus_mha_mean"] = statistics.fmean(diffs)
        r["minus_mha_std"] = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
    total = time.perf_counter() - start
    config = text_config(tokenizer.vocab_size)
    sweep = {
        "description": "Validation loss (nats per character) of the chapter's small decoder "
                       "with 4 (MHA), 2 (GQA) and 1 (MQA) key/value heads and 4 query heads, "
                       "trained with the same steps, data and seeds; std is the sample "
                       "standard deviation over the seeds.",
        "settings": {"text": "shakespeare.txt", "val_fraction": VAL_FRACTION,
                     "vocab_size": tokenizer.vocab_size, "d_model": config.d_model,
                     "n_layers": config.n_layers, "n_heads": config.n_heads,
                     "d_ff": config.d_ff, "tie_embeddings": config.tie_embeddings,
                     **settings, "seeds": seeds},
        "results": results,
        "total_seconds": round(total, 1),
        "measured_on": machine(threads),
        "date": datetime.date.today().isoformat(),
    }
    out.write_text(json.dumps(sweep, indent=1) + "\n", encoding="utf-8")
    print("\n".join(f"{r['name']}: {r['mean']:.4f} ± {r['std']:.4f} "
                    f"(minus MHA {r['minus_mha_mean']:+.4f} ± {r['minus_mha_std']:.4f})"
                    for r in results))
    print(f"wrote {out}; the sweep took {total:.0f} s on {machine(threads)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Train the character-level decoder of chapters 6 and 7 on the bundled "
                    "Shakespeare (writes transformer_lib/data/tiny_lm.pt), or, with --sweep, "
                    "compare MHA, GQA and MQA at one budget over several seeds (writes "
                    "transformer_lib/data/kv_heads_sweep.json). Prints how long it took.")
    parser.add_argument("--sweep", action="store_true",
                        help="run the MHA/GQA/MQA comparison instead of training the checkpoint")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"training steps (default {TRAIN['steps']}; "
                             f"{SWEEP_TRAIN['steps']} per run with --sweep)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the checkpoint (default 0)")
    parser.add_argument("--seeds", default="0,1,2",
                        help="comma-separated seeds of the sweep (default 0,1,2)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads (default 2; use 1 on a busy machine)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output file (default: the bundled one in transformer_lib/data/)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    torch.set_num_threads(args.threads)
    if args.sweep:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
        if len(seeds) < 2:
            parser.error("--seeds needs at least two seeds for a spread")
        run_sweep(args.out or DATA / "kv_heads_sweep.json", seeds,
                  args.steps or SWEEP_TRAIN["steps"], args.threads)
    else:
        train_checkpoint(args.out or DATA / "tiny_lm.pt", args.steps or TRAIN["steps"],
                         args.seed, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
