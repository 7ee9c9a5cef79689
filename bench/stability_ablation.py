"""The training-stability ablation of chapter 4: post-norm or pre-norm, Noam warmup or none.

Trains the reversal model of ``transformer_lib.tasks`` once per depth × norm placement ×
schedule × seed (``transformer_lib.stability.stability_ablation``) and writes the results, with
the command and the time it took, to ``transformer_lib/data/stability_ablation.json``, the
file the chapter plots (``load_stability_ablation()``). Every run is seeded: the same command
on the same software gives the same numbers. It runs single-threaded (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``), as the book does; the default sweep (60 runs) takes several
minutes of one CPU core. Besides the wall-clock time the JSON keeps the CPU time, which other
programs on a busy machine do not inflate. The options default to ``stability_ablation``'s own
defaults.

    python bench/stability_ablation.py                 # the sweep shipped with the library
    python bench/stability_ablation.py --depths 4 --lr-scale 0.1 --steps 1200 \
        --out transformer_lib/data/stability_lower_rate.json   # 4 layers, a quarter the rate
    python bench/stability_ablation.py --depths 2 --seeds 1 --out /tmp/small.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from transformer_lib.stability import (
    NORM_PLACEMENTS,
    STABILITY_FILE,
    parameter_defaults,
    stability_ablation,
)
from transformer_lib.tasks import SCHEDULES

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "transformer_lib" / "data" / STABILITY_FILE
DEFAULTS = parameter_defaults(stability_ablation)  # the sweep shipped with the library


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Post-norm vs pre-norm x Noam warmup vs none on the reversal task: train "
                    "every combination for several depths and seeds, write the results as JSON "
                    "and print the time it took.")
    depths, seeds = list(DEFAULTS["depths"]), len(DEFAULTS["seeds"])
    parser.add_argument("--depths", type=int, nargs="+", default=depths,
                        help="layers per stack, encoder and decoder (default: "
                             f"{' '.join(map(str, depths))})")
    parser.add_argument("--seeds", type=int, default=seeds,
                        help=f"seeds 0 .. N-1 for every setting (default: {seeds})")
    parser.add_argument("--steps", type=int, default=DEFAULTS["steps"],
                        help="updates per run (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"],
                        help="sequences per update (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=DEFAULTS["warmup"],
                        help="Noam warmup steps; the peak rate is reached there "
                             "(default: %(default)s)")
    parser.add_argument("--lr-scale", type=float, default=DEFAULTS["lr_scale"],
                        help="factor on the Noam rate, as train_reversal's lr_scale "
                             "(default: %(default)s)")
    parser.add_argument("--norms", nargs="+", choices=NORM_PLACEMENTS,
                        default=list(DEFAULTS["norms"]),
                        help="norm placements to run (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"where to write the JSON (default: {DEFAULT_OUT})")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    command = "python bench/stability_ablation.py" + "".join(
        f" {arg}" for arg in (argv if argv is not None else sys.argv[1:]))
    n_runs = len(args.depths) * len(args.norms) * len(SCHEDULES) * args.seeds
    print(f"{n_runs} runs: depths {args.depths} x {'/'.join(args.norms)}-norm x noam/no-warmup x "
          f"{args.seeds} seeds, {args.steps} steps of {args.batch_size} sequences", flush=True)
    start, cpu_start = time.perf_counter(), time.process_time()
    results = stability_ablation(args.depths, range(args.seeds), steps=args.steps,
                                 batch_size=args.batch_size, warmup=args.warmup,
                                 lr_scale=args.lr_scale, norms=args.norms,
                                 log=lambda line: print(line, flush=True))
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    results = {
        "command": command,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu_seconds, 1),
        "machine": {"torch": torch.__version__, "python": platform.python_version(),
                    "threads": torch.get_num_threads(), "cpus": os.cpu_count()},
        **results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{n_runs} runs in {seconds:.0f} s ({seconds / 60:.1f} min; CPU time "
          f"{cpu_seconds:.0f} s); wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
