"""SwiGLU against a ReLU FFN, and RMSNorm against LayerNorm, in chapter 6's small decoder.

    python bench/ffn_norm_ablation.py     # writes transformer_lib/data/ffn_norm_ablation.json

The four variants (SwiGLU or ReLU, RMSNorm or LayerNorm) of the chapter's small character
model (``text_config``: ``d_model`` 64, 2 layers, 4 query heads sharing 2 key/value heads,
SwiGLU width 172, tied embeddings) train on the bundled text with the chapter's settings
(32 windows of 64 characters, peak rate 5e-3, 15 warm-up steps), at two budgets (150 steps,
the chapter's run, and 600), with three seeds each. The ReLU FFN has no biases and width
3/2 · 172 = 258, so it holds exactly SwiGLU's 3 · 64 · 172 weights; LayerNorm adds a bias of
64 numbers to each of the five norms (320 parameters, 0.3 % of the model). A seed fixes the
initial weights of everything the variants share and the training windows, so the
variants are compared seed by seed. Every run's final training loss (mean of the last 20
steps) and validation loss (all of the last 10 % of the text) are stored, with the paired
differences against SwiGLU + RMSNorm. Prints how long it took.
"""
from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from train_text_model import VAL_FRACTION, bundled_splits, machine  # the same text and split

from transformer_lib.text import evaluate_loss, text_config, train_text_model

DATA = Path(__file__).resolve().parent.parent / "transformer_lib" / "data"
TRAIN = dict(batch_size=32, seq_len=64, lr=5e-3, warmup=15)  # the chapter's run
BUDGETS = (150, 600)  # training steps
SEEDS = (0, 1, 2)
VARIANTS = (("swiglu", "rms"), ("relu", "rms"), ("swiglu", "layer"), ("relu", "layer"))


def _spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values)}


def run(out: Path, budgets: tuple[int, ...], seeds: tuple[int, ...], threads: int) -> None:
    tokenizer, train_ids, val_ids = bundled_splits()
    config = text_config(tokenizer.vocab_size)
    start = time.perf_counter()
    results = []
    for steps in budgets:
        rows = []
        for ffn, norm in VARIANTS:
            train, val = [], []
            for seed in seeds:
                model, history = train_text_model(config, train_ids, steps=steps, seed=seed,
                                                  ffn=ffn, norm=norm, **TRAIN)
                train.append(statistics.fmean(history["loss"][-20:]))
                val.append(evaluate_loss(model, val_ids, TRAIN["seq_len"]))
                print(f"  {steps} steps, {ffn} + {norm}, seed {seed}: train {train[-1]:.4f}, "
                      f"validation {val[-1]:.4f} ({history['seconds']:.0f} s)", flush=True)
            rows.append({"name": f"{ffn}+{norm}", "ffn": ffn, "norm": norm,
                         "params": sum(p.numel() for p in model.parameters()),
                         "train_loss": train, "val_loss": val, "val": _spread(val)})
        base = rows[0]["val_loss"]
        for row in rows:  # paired by seed: the same windows and shared initial weights
            row["minus_baseline"] = _spread([a - b for a, b in zip(row["val_loss"], base)])
        results.append({"steps": steps, "variants": rows})
    total = time.perf_counter() - start
    saved = {
        "description": "Final training loss (mean of the last 20 steps) and validation loss "
                       "(nats per character, the last 10 % of the text) of chapter 6's small "
                       "decoder with SwiGLU or a bias-free ReLU FFN of the same parameters, "
                       "and RMSNorm or LayerNorm, per seed; minus_baseline: the validation "
                       "loss minus that of swiglu+rms with the same seed.",
        "settings": {"text": "shakespeare.txt", "val_fraction": VAL_FRACTION,
                     "vocab_size": tokenizer.vocab_size, "d_model": config.d_model,
                     "n_layers": config.n_layers, "n_heads": config.n_heads,
                     "n_kv_heads": config.n_kv_heads, "d_ff": config.d_ff,
                     "relu_d_ff": 3 * config.d_ff // 2, **TRAIN, "seeds": list(seeds)},
        "budgets": results,
        "total_seconds": round(total, 1),
        "measured_on": machine(threads),
        "date": datetime.date.today().isoformat(),
    }
    out.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")
    for budget in results:
        print(f"{budget['steps']} steps:")
        for row in budget["variants"]:
            d = row["minus_baseline"]
            print(f"  {row['name']:13s} validation {row['val']['mean']:.4f} "
                  f"({row['val']['min']:.4f}-{row['val']['max']:.4f}); minus swiglu+rms "
                  f"{d['min']:+.4f} to {d['max']:+.4f}")
    print(f"wrote {out}; the comparison took {total:.0f} s on {machine(threads)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Compare SwiGLU with a ReLU FFN and RMSNorm with LayerNorm in chapter 6's "
                    "small decoder (writes transformer_lib/data/ffn_norm_ablation.json).")
    parser.add_argument("--steps", default=",".join(map(str, BUDGETS)),
                        help="comma-separated training budgets (default 150,600)")
    parser.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                        help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", type=Path, default=DATA / "ffn_norm_ablation.json",
                        help="output file (default: the bundled one)")
    args = parser.parse_args(argv)
    budgets = tuple(int(s) for s in args.steps.split(",") if s.strip())
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    if args.threads < 1 or not budgets or min(budgets) <= TRAIN["warmup"] or len(seeds) < 2:
        parser.error("--threads must be positive, every budget above the 15 warm-up steps, "
                     "and --seeds needs at least two seeds for a spread")
    torch.set_num_threads(args.threads)
    run(args.out, budgets, seeds, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
