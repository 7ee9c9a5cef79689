"""What sharing key/value heads costs on a task where the query heads need different things.

    python bench/kv_heads_recall.py    # writes transformer_lib/data/kv_heads_recall.json

Multi-attribute recall (:func:`transformer_lib.recall.shared_kv_recall`): a sequence of 16
items, each a unit key and one attribute per query head (4 heads of 16 channels), then 16
queries, each a stored key asking for all the attributes of its item. One attention layer
with 4 query heads and 4, 2 or 1 key/value heads (MHA, GQA, MQA) and a linear readout is
trained for each attribute size and seed (200 Adam steps on fresh data each). When the
attributes (4 · Da numbers per item) fit in the values the layer caches (H_kv · 16 numbers),
sharing costs nothing; when they do not, the error cannot fall below
1 - H_kv · 16 / (4 · Da). Chapter 7 reads the file and re-runs the first seed of Da = 12
live. About half a minute of processor time on one thread.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from transformer_lib.recall import KV_HEADS_RECALL_FILE, shared_kv_recall

OUT = Path(__file__).resolve().parents[1] / "transformer_lib" / "data" / KV_HEADS_RECALL_FILE
SETTINGS = dict(n_heads=4, head_dim=16, n_items=16, steps=200, batch=64, lr=1e-2)
D_ATTRIBUTES = (4, 8, 12)
KV_HEADS = (4, 2, 1)
SEEDS = (0, 1, 2, 3, 4)


def main() -> int:
    torch.set_num_threads(1)
    start = time.process_time()
    results = []
    for d_attribute in D_ATTRIBUTES:
        for kv in KV_HEADS:
            runs = [shared_kv_recall(kv, d_attribute=d_attribute, seed=seed, **SETTINGS)
                    for seed in SEEDS]
            errors = [r["error"] for r in runs]
            results.append({"d_attribute": d_attribute, "n_kv_heads": kv,
                            "errors": errors, "mean": statistics.mean(errors),
                            "std": statistics.stdev(errors), "floor": runs[0]["floor"],
                            "cache_numbers": runs[0]["cache_numbers"]})
            print(f"Da {d_attribute:2d}  H_kv {kv}  error {results[-1]['mean']:.3f} "
                  f"± {results[-1]['std']:.3f}  floor {results[-1]['floor']:.3f}")
    sweep = {
        "description": "Multi-attribute recall with one attention layer of 4 query heads and "
                       "4, 2 or 1 key/value heads: the fraction of the attributes' squared "
                       "norm not recovered on fresh test data, every seed, their mean and "
                       "sample standard deviation, and the floor 1 - H_kv*D/(A*Da).",
        "settings": {**SETTINGS, "d_attributes": list(D_ATTRIBUTES), "seeds": list(SEEDS)},
        "results": results,
        "machine": f"{platform.machine()} CPU ({os.cpu_count()} cores), 1 thread, "
                   f"torch {torch.__version__}, Python {platform.python_version()}",
        "date": datetime.date.today().isoformat(),
    }
    OUT.write_text(json.dumps(sweep, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT} in {time.process_time() - start:.0f} s of processor time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
