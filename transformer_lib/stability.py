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

NORM_PLACEMENTS = ("post", "pre")  #: post-norm LN(x + f(x)), the 2017 paper; pre-norm x + f(LN(x))
STABILITY_FILE = "stability_ablation.json"  #: the precomputed sweep, in transformer_lib/data/
LOWER_RATE_FILE = "stability_lower_rate.json"  #: 4 layers at lr_scale 0.1 (a quarter the peak)


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
                       every: int = 5, eval_n: int = 500, norms: Iterable[str] = NORM_PLACEMENTS,
                       schedules: Iterable[str] = SCHEDULES,
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
        norms: the placements to run, a subset of :data:`NORM_PLACEMENTS` (``"post"``, ``"pre"``).
        schedules: the schedules to run, a subset of ``tasks.SCHEDULES`` (``"noam"``,
            ``"no-warmup"``).
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
    norms = list(norms)
    if not norms or any(norm not in NORM_PLACEMENTS for norm in norms):
        raise ValueError(f"norms must be a non-empty subset of {NORM_PLACEMENTS}, got {norms}")
    schedules = list(schedules)
    if not schedules or any(schedule not in SCHEDULES for schedule in schedules):
        raise ValueError(f"schedules must be a non-empty subset of {SCHEDULES}, "
                         f"got {schedules}")
    base = reversal_config()
    settings = dict(depths=depths, seeds=seeds, steps=steps, batch_size=batch_size,
                    warmup=warmup, lr_scale=lr_scale, every=every, eval_n=eval_n,
                    d_model=base.d_model, n_heads=base.n_heads, d_ff=base.d_ff,
                    n_symbols=base.tgt_vocab_size - 1, seq_len=_TRAIN["seq_len"],
                    smoothing=_TRAIN["smoothing"],
                    peak_lr=lr_scale * noam_lambda(base.d_model, warmup)(warmup))
    runs = []
    for depth in depths:
        for norm in (n for n in NORM_PLACEMENTS if n in norms):
            pre = norm == "pre"
            config = reversal_config(n_layers=depth, norm_first=pre, final_norm=pre)
            for schedule in (s for s in SCHEDULES if s in schedules):
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


def load_stability_ablation(file: str = STABILITY_FILE) -> dict:
    """A precomputed :func:`stability_ablation` that ships with the library, by default
    ``transformer_lib/data/stability_ablation.json`` (:data:`LOWER_RATE_FILE` is the 4-layer
    sweep at a lower peak rate), written by ``bench/stability_ablation.py``: its
    ``"settings"`` and ``"runs"``, plus ``"command"`` (how to reproduce it), ``"seconds"`` and
    ``"cpu_seconds"`` (how long that took, wall clock and CPU time) and ``"machine"``.

    Args:
        file: the file's name in ``transformer_lib/data/``.
    """
    return load_json(file)


# ---- Reading a sweep: the tables chapter 4 prints ------------------------------------------

SOLVED_AT = 0.95  #: a run "solved" the task when this share of fresh sequences is exactly right
_SCHEDULE_WORDS = {"noam": "warmup", "no-warmup": "no warmup"}


def run_label(norm: str, schedule: str, *, short: bool = False) -> str:
    """A setting in words: ``run_label("post", "noam")`` is ``"post-norm, warmup"``
    (``"post, warmup"`` with ``short=True``).

    Args:
        norm: ``"post"`` or ``"pre"``.
        schedule: ``"noam"`` or ``"no-warmup"``.
        short: leave "-norm" out.

    Returns:
        The label.
    """
    if norm not in NORM_PLACEMENTS or schedule not in _SCHEDULE_WORDS:
        raise ValueError(f"norm must be one of {NORM_PLACEMENTS} and schedule one of "
                         f"{tuple(_SCHEDULE_WORDS)}, got {norm!r} and {schedule!r}")
    return f"{norm if short else norm + '-norm'}, {_SCHEDULE_WORDS[schedule]}"


def summarise_ablation(runs: list[dict], solved_at: float = SOLVED_AT
                       ) -> dict[tuple[int, str, str], dict]:
    """Group the runs of a sweep by setting.

    Args:
        runs: the ``"runs"`` of :func:`stability_ablation` or :func:`load_stability_ablation`.
        solved_at: the exact-match share from which a run counts as solved.

    Returns:
        ``(depth, norm, schedule)`` -> ``{"seeds", "final_loss", "token_accuracy",
        "exact_match"}`` (lists in seed order), ``"solved"`` (how many runs reached
        ``solved_at``) and ``"max_grad_norm"`` (the largest of the setting's runs).
    """
    if not runs:
        raise ValueError("runs is empty: give the runs of a sweep")
    table: dict[tuple[int, str, str], dict] = {}
    for run in sorted(runs, key=lambda r: r["seed"]):
        row = table.setdefault((run["depth"], run["norm"], run["schedule"]),
                               {"seeds": [], "final_loss": [], "token_accuracy": [],
                                "exact_match": [], "max_grad_norm": 0.0})
        row["seeds"].append(run["seed"])
        for name in ("final_loss", "token_accuracy", "exact_match"):
            row[name].append(run[name])
        row["max_grad_norm"] = max(row["max_grad_norm"], run["max_grad_norm"])
    for row in table.values():
        row["solved"] = sum(e >= solved_at for e in row["exact_match"])
    return table


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _spread(values: list[float], digits: int) -> str:
    """``median [lowest, highest]`` of ``values``."""
    return (f"{_median(values):.{digits}f} [{min(values):.{digits}f}, "
            f"{max(values):.{digits}f}]")


def ablation_table(runs: list[dict], solved_at: float = SOLVED_AT) -> str:
    """The sweep as a text table, one row per depth and setting: the final loss and the token
    accuracy (median over the seeds, with the lowest and highest), the median exact match and
    how many seeds solved the task; a last line gives the largest gradient norm of any run
    and whether every loss stayed finite.

    Args:
        runs: the ``"runs"`` of a sweep.
        solved_at: as in :func:`summarise_ablation`.

    Returns:
        The table, lines at most 80 characters wide.
    """
    table = summarise_ablation(runs, solved_at)
    lines = [f"median over the seeds [lowest, highest]; solved: exact match >= {solved_at}",
             f"{'depth':>5}  {'setting':15s}  {'final loss':20s}  {'token accuracy':16s}  "
             f"{'exact':>5}  {'solved':>6}"]
    for depth, norm, schedule in sorted(table, key=lambda k: (k[0], NORM_PLACEMENTS.index(k[1]),
                                                              SCHEDULES.index(k[2]))):
        row = table[depth, norm, schedule]
        solved = f"{row['solved']}/{len(row['seeds'])}"
        lines.append(f"{depth:5d}  {run_label(norm, schedule, short=True):15s}  "
                     f"{_spread(row['final_loss'], 3):20s}  "
                     f"{_spread(row['token_accuracy'], 2):16s}  "
                     f"{_median(row['exact_match']):5.2f}  {solved:>6}")
    largest = max(r["max_grad_norm"] for r in runs)
    finite = all(r["finite"] for r in runs)
    lines.append(f"largest gradient norm in any run: {largest:.1f}; "
                 f"every loss finite: {'yes' if finite else 'no'}")
    return "\n".join(lines)


def live_table(live: list[dict], saved: list[dict]) -> str:
    """Runs made now next to the same settings in a saved sweep, at the window where the live
    runs end (their curves are the first windows of the saved ones when seed and settings
    agree).

    Args:
        live: runs of :func:`stability_ablation` (the same ``every`` as ``saved``).
        saved: the runs of the saved sweep, e.g. ``load_stability_ablation()["runs"]``.

    Returns:
        One row per live run: its mean loss in its last window, the saved run of the same
        depth, setting and seed in that window, and the lowest to highest saved seed there.
    """
    if not live:
        raise ValueError("live is empty: give the runs made now")
    lines = [f"{'mean loss, last window':26s}  {'live':>6}  {'saved, same seed':>16}  "
             f"{'saved, all seeds':>16}"]
    for run in live:
        window = len(run["loss"]) - 1
        same = [r for r in saved if (r["depth"], r["norm"], r["schedule"]) ==
                (run["depth"], run["norm"], run["schedule"])]
        if not same or len(same[0]["loss"]) <= window:
            raise ValueError(f"the saved runs have no window {window} for depth "
                             f"{run['depth']}, {run_label(run['norm'], run['schedule'])}")
        seed = [r["loss"][window] for r in same if r["seed"] == run["seed"]]
        at = [r["loss"][window] for r in same]
        seed_text = f"{seed[0]:.3f}" if seed else "-"
        label = f"{run['depth']} layers, {run_label(run['norm'], run['schedule'], short=True)}"
        lines.append(f"{label:26s}  {run['loss'][window]:6.3f}  {seed_text:>16}  "
                     f"{min(at):.3f} to {max(at):.3f}".rstrip())
    return "\n".join(lines)
