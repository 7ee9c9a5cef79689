"""Chapter 3's two-reads task with 1, 2, 4 and 8 heads at the same width: what the heads read.

    python bench/two_reads_heads.py    # writes transformer_lib/data/two_reads_heads.json

Each sequence holds seven (key, value) pairs and a query that repeats one of the keys; from
the query position one attention layer (``MultiHeadAttention`` of width C = 32, no
feed-forward layer, no residual) and two linear read-outs must give the value stored under
the query's key and the value stored just before the query. The task, the model and the
training (200 Adam steps, seed 0) are chapter 3's cells "Do more heads help?" written out
here; the chapter trains 1 and 4 heads live, this script also 2 and 8. For each head count
it keeps the accuracies on the chapter's 2,000 test sequences, each head's mean weight at
the query on the asked pair and on the position before, and, for a few test sequences whose
asked pair is not the one before the query, each head's weights at the query and the two
predictions. ``transformer_lib.widgets.heads_explorer`` draws them. It also trains the
one-head layer for 1,000 and 10,000 steps, 5 and 50 times the chapter's budget, and keeps its
accuracies: does a longer run find the second read? About a minute of processor time on one
thread, nearly all of it the long runs.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from transformer_lib.attention import MultiHeadAttention
from transformer_lib.recording import record_weights
from transformer_lib.widgets.heads import TWO_READS_HEADS_FILE

OUT = Path(__file__).resolve().parents[1] / "transformer_lib" / "data" / TWO_READS_HEADS_FILE
HEADS = (1, 2, 4, 8)
C, STEPS, SEED = 32, 200, 0
N_TEST, TEST_SEED, N_EXAMPLES = 2000, 1234, 8
LONG_STEPS = (1_000, 10_000)  # the one-head layer, trained 5 and 50 times longer
N_KEYS, N_VALUES = 16, 16  # possible keys, possible values
T_R = 8  # positions: 7 stored pairs, then the query
EMPTY = N_VALUES  # the query's value slot


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and PyTorch, as the chapter does."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def two_reads_batch(n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """n sequences of 7 (key, value) pairs and a query: keys and values (n, T_R); the value
    under the query's key, the value just before the query, and the asked pair (n,) each."""
    keys = torch.rand(n, N_KEYS, generator=gen).argsort(dim=1)[:, :T_R]  # (n, T) distinct
    values = torch.randint(N_VALUES, (n, T_R), generator=gen)  # (n, T)
    asked = torch.randint(T_R - 1, (n,), generator=gen)  # (n,): the pair asked for
    rows = torch.arange(n)
    keys[:, -1] = keys[rows, asked]  # the query repeats one stored key
    values[:, -1] = EMPTY
    return keys, values, values[rows, asked], values[:, -2], asked


class TwoReads(torch.nn.Module):
    """Embeddings, one attention layer of n_heads heads, two read-outs at the query."""

    def __init__(self, C: int, n_heads: int):
        super().__init__()
        self.key_emb = torch.nn.Embedding(N_KEYS, C)
        self.value_emb = torch.nn.Embedding(N_VALUES + 1, C)
        self.pos_emb = torch.nn.Embedding(T_R, C)
        self.attn = MultiHeadAttention(C, n_heads)
        self.read_match = torch.nn.Linear(C, N_VALUES)  # the value under the query's key
        self.read_prev = torch.nn.Linear(C, N_VALUES)  # the value just before the query

    def forward(self, keys: torch.Tensor, values: torch.Tensor):
        x = self.key_emb(keys) + self.value_emb(values) + self.pos_emb.weight  # (B, T, C)
        out = self.attn(x)[:, -1]  # (B, C): the query position's output
        return self.read_match(out), self.read_prev(out)  # (B, N_VALUES) each


def train_two_reads(n_heads: int, seed: int = SEED, C: int = C, steps: int = STEPS):
    """TwoReads(C, n_heads) after `steps` Adam steps on fresh batches of 128, seeded."""
    seed_everything(seed)
    model = TwoReads(C, n_heads)
    gen = torch.Generator().manual_seed(seed)  # the training batches
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        keys, values, y_match, y_prev, _ = two_reads_batch(128, gen)
        logits_match, logits_prev = model(keys, values)
        loss = (F.cross_entropy(logits_match, y_match)
                + F.cross_entropy(logits_prev, y_prev))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def measure(model: TwoReads, test: tuple[torch.Tensor, ...], shown: torch.Tensor) -> dict:
    """Accuracies on the test sequences, each head's mean weight at the query on the asked
    pair and on the position before (where they differ), and the weights and predictions
    of the ``shown`` sequences."""
    keys, values, y_match, y_prev, asked = test
    with torch.no_grad(), record_weights(model):
        logits_match, logits_prev = model(keys, values)  # (n, N_VALUES) each
    w = model.attn.last_weights[:, :, -1]  # (n, H, S): each head's weights at the query
    right_match = logits_match.argmax(-1) == y_match  # (n,)
    right_prev = logits_prev.argmax(-1) == y_prev  # (n,)
    elsewhere = asked != T_R - 2
    on_match = w[torch.arange(len(asked)), :, asked][elsewhere].mean(0)  # (H,)
    on_prev = w[:, :, T_R - 2][elsewhere].mean(0)  # (H,)
    return {
        "n_heads": w.shape[1],
        "accuracy": {"match": right_match.float().mean().item(),
                     "prev": right_prev.float().mean().item(),
                     "both": (right_match & right_prev).float().mean().item()},
        "on_match": [round(x, 4) for x in on_match.tolist()],
        "on_prev": [round(x, 4) for x in on_prev.tolist()],
        "weights": [[[round(x, 4) for x in head] for head in seq]
                    for seq in w[shown].tolist()],  # (examples, H, S)
        "predicted": {"match": logits_match[shown].argmax(-1).tolist(),
                      "prev": logits_prev[shown].argmax(-1).tolist()},
    }


def main() -> int:
    torch.set_num_threads(1)
    start = time.process_time()
    test = two_reads_batch(N_TEST, torch.Generator().manual_seed(TEST_SEED))
    keys, values, y_match, y_prev, asked = test
    # The first test sequences whose asked pair is not the one just before the query.
    shown = torch.nonzero(asked != T_R - 2).flatten()[:N_EXAMPLES]  # (N_EXAMPLES,)
    results = []
    for n_heads in HEADS:
        results.append(measure(train_two_reads(n_heads), test, shown))
        r = results[-1]["accuracy"]
        print(f"{n_heads} heads: value under key {r['match']:.3f}, value before "
              f"{r['prev']:.3f}, both {r['both']:.3f}")
    long_runs = []
    for steps in LONG_STEPS:
        r = measure(train_two_reads(1, steps=steps), test, shown)["accuracy"]
        long_runs.append({"n_heads": 1, "steps": steps, "accuracy": r})
        print(f"1 head, {steps:,} steps: value under key {r['match']:.3f}, value before "
              f"{r['prev']:.3f}")
    seconds = time.process_time() - start
    sweep = {
        "description": "Chapter 3's two-reads task (7 key-value pairs, then a query that "
                       "repeats a key) with one attention layer of width 32 and 1, 2, 4 or 8 "
                       "heads: accuracies on 2,000 test sequences, each head's mean weight at "
                       "the query on the asked pair and on the position before (sequences "
                       "where they differ), and the weights at the query and the predictions "
                       "for the first test sequences where they differ; and the one-head "
                       "layer's accuracies after 1,000 and 10,000 steps (long_runs).",
        "settings": {"C": C, "steps": STEPS, "batch": 128, "lr": 3e-3, "seed": SEED,
                     "heads": list(HEADS), "n_test": N_TEST, "test_seed": TEST_SEED,
                     "n_keys": N_KEYS, "n_values": N_VALUES, "positions": T_R},
        "examples": {"index": shown.tolist(), "keys": keys[shown].tolist(),
                     "values": values[shown].tolist(), "asked": asked[shown].tolist(),
                     "match": y_match[shown].tolist(), "prev": y_prev[shown].tolist()},
        "results": results,
        "long_runs": long_runs,
        "command": "python bench/two_reads_heads.py",
        "cpu_seconds": round(seconds, 1),
        "machine": f"{platform.machine()} CPU ({os.cpu_count()} cores), 1 thread, "
                   f"torch {torch.__version__}, Python {platform.python_version()}",
        "date": datetime.date.today().isoformat(),
    }
    OUT.write_text(json.dumps(sweep, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} in {seconds:.1f} s of processor time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
