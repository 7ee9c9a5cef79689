"""Chapter 4's training-stability ablation on the reversal task: post-norm or pre-norm, Noam
warm-up or none, at several depths and seeds, and the precomputed sweep that ships with the
library.

Every run is :func:`transformer_lib.tasks.train_reversal` with that function's own defaults
for what the sweep does not vary (sequence length, label smoothing, ...), so the two never
disagree. ``bench/stability_ablation.py`` runs the sweep and writes the bundled JSON;
:func:`load_stability_ablation` reads it.
"""
from __future__ import annotations

import inspect
import math
import time
from typing import Any, Callable, Iterable

from transformer_lib.encoder_decoder import EncoderDecoderConfig, noam_lambda
from transformer_lib.resources import load_json
from transformer_lib.tasks import SCHEDULES, evaluate_reversal, reversal_config, train_reversal

NORMS = ("post", "pre")  # post-norm LN(x + f(x)), the 2017 paper; pre-norm x + f(LN(x))
ABLATION_FILE = "stability_ablation.json"  # the precomputed sweep, in transformer_lib/data/


def parameter_defaults(function: Callable) -> dict[str, Any]:
    """The default value of each parameter of ``function`` that has one.

    Args:
        function: any callable, e.g. :func:`~transformer_lib.tasks.train_reversal`.

    Returns:
        parameter name -> default value (parameters without a default are left out).
    """
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.default is not inspect.Parameter.empty}


_TRAIN = parameter_defaults(train_reversal)  # what every run shares with train_reversal


def _windows(values: list[float], every: int, reduce: Callable[[list[float]], float]
             ) -> list[float]:
    """``values`` cut into windows of ``every`` entries, each reduced to one number (4
    significant digits: the JSON stays small)."""
    return [float(f"{reduce(values[i:i + every]):.4g}") for i in range(0, len(values), every)]


def _window_mean(window: list[float]) -> float:
    """The mean of ``window``; NaN or inf in the window stays NaN or inf."""
    return sum(window) / len(window)


def _one_run(config: EncoderDecoderConfig, *, depth: int, norm: str, schedule: str, seed: int,
             every: int, eval_n: int, **training) -> dict:
    """Train and evaluate one setting of the sweep; the run's dict of
    :func:`stability_ablation`."""
    start, cpu_start = time.perf_counter(), time.process_time()
    model, history = train_reversal(config, seed=seed, schedule=schedule, **training)
    result = evaluate_reversal(model, eval_n, _TRAIN["seq_len"])
    losses, norms = history["loss"], history["grad_norm"]
    return dict(depth=depth, norm=norm, schedule=schedule, seed=seed,
                final_loss=round(_window_mean(losses[-every:]), 4),
                exact_match=round(result["exact_match"], 4),
                token_accuracy=round(result["token_accuracy"], 4),
                max_grad_norm=round(max(norms), 3),
                finite=all(math.isfinite(v) for v in losses),
                seconds=round(time.perf_counter() - start, 2),
                cpu_seconds=round(time.process_time() - cpu_start, 2),
                loss=_windows(losses, every, _window_mean),
                grad_norm=_windows(norms, every, max))


def stability_ablation(depths: Iterable[int] = (2, 4, 6), seeds: Iterable[int] = range(5), *,
                       steps: int = 300, batch_size: int = 64,
                       warmup: int = _TRAIN["warmup"], lr_scale: float = _TRAIN["lr_scale"],
                       every: int = 5, eval_n: int = 500,
                       log: Callable[[str], None] | None = None) -> dict:
    """Train the reversal model for every depth × norm placement × schedule × seed.

    Each run is :func:`~transformer_lib.tasks.train_reversal` on
    :func:`~transformer_lib.tasks.reversal_config` with ``n_layers=depth`` (encoder and
    decoder), post-norm (the paper) or pre-norm (``norm_first=True`` with the final LayerNorm
    a pre-norm stack needs), and the ``"noam"`` or ``"no-warmup"`` schedule: the same peak
    learning rate, reached after ``warmup`` steps or used from step 1.

    Args:
        depths: layers per stack.
        seeds: one run per seed and setting.
        steps, batch_size, warmup, lr_scale: passed to ``train_reversal`` (``warmup`` and
            ``lr_scale`` default to its own defaults).
        every: the curves keep one point per ``every`` updates (the window's mean loss and
            its largest gradient norm).
        eval_n: fresh sequences greedy-decoded at the end (``evaluate_reversal``).
        log: called with one line per finished run (e.g. ``print``), or None.

    Returns:
        A JSON-ready dict: ``"settings"`` (the arguments, ``train_reversal``'s ``seq_len``
        and ``smoothing``, and the model's sizes) and ``"runs"``, one dict per run with
        ``depth``, ``norm`` (``"post"``/``"pre"``), ``schedule``, ``seed``, ``final_loss``
        (mean of the last ``every`` updates), ``exact_match``, ``token_accuracy``,
        ``max_grad_norm``, ``finite`` (no NaN or inf loss), ``seconds`` (wall clock) and
        ``cpu_seconds`` (CPU time of this process, which other programs on a busy machine do
        not inflate), and the curves ``loss`` and ``grad_norm`` (one point per window; point
        ``i`` covers updates ``i·every`` … ``i·every + every − 1``).
    """
    depths, seeds = [int(d) for d in depths], [int(s) for s in seeds]
    if not depths or not seeds or min(depths) < 1:
        raise ValueError(f"need at least one depth (>= 1) and one seed, got depths={depths}, "
                         f"seeds={seeds}")
    if every < 1 or every > steps:
        raise ValueError(f"every ({every}) must be in [1, steps = {steps}]")
    base = reversal_config()
    settings = dict(depths=depths, seeds=seeds, steps=steps, batch_size=batch_size,
                    warmup=warmup, lr_scale=lr_scale, every=every, eval_n=eval_n,
                    d_model=base.d_model, n_heads=base.n_heads, d_ff=base.d_ff,
                    n_symbols=base.tgt_vocab_size - 1, seq_len=_TRAIN["seq_len"],
                    smoothing=_TRAIN["smoothing"],
                    peak_lr=lr_scale * noam_lambda(base.d_model, warmup)(warmup))
    runs = []
    for depth in depths:
        for norm in NORMS:
            pre = norm == "pre"
            config = reversal_config(n_layers=depth, norm_first=pre, final_norm=pre)
            for schedule in SCHEDULES:
                for seed in seeds:
                    run = _one_run(config, depth=depth, norm=norm, schedule=schedule, seed=seed,
                                   every=every, eval_n=eval_n, steps=steps,
                                   batch_size=batch_size, warmup=warmup, lr_scale=lr_scale)
                    runs.append(run)
                    if log is not None:
                        log(f"depth {depth}  {norm + '-norm':9s}  {schedule:9s}  seed {seed}:  "
                            f"final loss {run['final_loss']:.3f}  exact match "
                            f"{run['exact_match']:.2f}  max grad norm "
                            f"{run['max_grad_norm']:.1f}  ({run['seconds']:.1f} s)")
    return {"settings": settings, "runs": runs}


def load_stability_ablation() -> dict:
    """The precomputed :func:`stability_ablation` that ships with the library
    (``transformer_lib/data/stability_ablation.json``, written by
    ``bench/stability_ablation.py``): its ``"settings"`` and ``"runs"``, plus ``"command"``
    (how to reproduce it), ``"seconds"`` and ``"cpu_seconds"`` (how long that took, wall
    clock and CPU time) and ``"machine"``."""
    return load_json(ABLATION_FILE)
