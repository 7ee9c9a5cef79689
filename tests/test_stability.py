"""Chapter 4's training-stability ablation (transformer_lib.stability): the sweep runs every
setting, the shipped results are complete, the bench script writes what the loader reads, and
the sweep shares train_reversal's defaults instead of repeating them."""
import inspect

import pytest
import torch

from transformer_lib import stability, tasks
from transformer_lib.tasks import evaluate_reversal, reversal_config, train_reversal


def test_the_sweep_is_importable_from_tasks_as_before():
    for name in ("stability_ablation", "load_stability_ablation", "NORMS", "ABLATION_FILE"):
        assert getattr(tasks, name) is getattr(stability, name)
    from transformer_lib.tasks import load_stability_ablation

    assert load_stability_ablation is stability.load_stability_ablation
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        tasks.no_such_name


def test_the_sweep_takes_train_reversals_defaults():
    """What the sweep does not vary is whatever train_reversal does by default; the settings
    it records say so."""
    train = inspect.signature(train_reversal).parameters
    sweep = inspect.signature(stability.stability_ablation).parameters
    assert sweep["warmup"].default == train["warmup"].default
    assert sweep["lr_scale"].default == train["lr_scale"].default
    settings = stability.load_stability_ablation()["settings"]
    assert settings["seq_len"] == train["seq_len"].default
    assert settings["smoothing"] == train["smoothing"].default
    assert stability.parameter_defaults(lambda a, b=2, *, c=None: 0) == {"b": 2, "c": None}


def test_the_bench_script_defaults_are_the_librarys():
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "stability_ablation.py"
    spec = importlib.util.spec_from_file_location("stability_bench", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = bench.parse_args([])
    defaults = stability.parameter_defaults(stability.stability_ablation)
    assert args.depths == list(defaults["depths"]) and args.seeds == len(defaults["seeds"])
    assert (args.steps, args.batch_size, args.warmup, args.lr_scale) == (
        defaults["steps"], defaults["batch_size"], defaults["warmup"], defaults["lr_scale"])
    assert bench.parse_args(["--depths", "3", "5"]).depths == [3, 5]


def test_stability_ablation_runs_every_setting_and_keeps_the_histories():
    from transformer_lib.stability import stability_ablation

    torch.manual_seed(7)
    state = torch.get_rng_state()
    lines = []
    result = stability_ablation([1], [0, 1], steps=6, batch_size=8, every=4, eval_n=20,
                                log=lines.append)
    assert torch.equal(torch.get_rng_state(), state)
    runs = result["runs"]
    assert [(r["norm"], r["schedule"], r["seed"]) for r in runs] == [
        (n, s, seed) for n in ("post", "pre") for s in ("noam", "no-warmup") for seed in (0, 1)]
    assert len(lines) == 8 and "depth 1  pre-norm   no-warmup  seed 1:" in lines[-1]
    assert result["settings"]["peak_lr"] == pytest.approx(0.4 * 32 ** -0.5 * 60 ** -0.5)
    # Run 6 is pre-norm, no warmup, seed 0: the same as training it directly.
    config = reversal_config(n_layers=1, norm_first=True, final_norm=True)
    model, history = train_reversal(config, steps=6, batch_size=8, seed=0, schedule="no-warmup")
    run = runs[6]
    assert run["loss"] == pytest.approx([sum(history["loss"][:4]) / 4,
                                         sum(history["loss"][4:]) / 2], rel=1e-3)
    assert run["grad_norm"] == pytest.approx([max(history["grad_norm"][:4]),
                                              max(history["grad_norm"][4:])], rel=1e-3)
    assert run["final_loss"] == pytest.approx(sum(history["loss"][2:]) / 4, abs=1e-4)
    assert run["exact_match"] == pytest.approx(evaluate_reversal(model, 20)["exact_match"])
    assert run["finite"] and run["max_grad_norm"] == pytest.approx(max(history["grad_norm"]),
                                                                   rel=1e-3)
    with pytest.raises(ValueError, match=r"every \(9\) must be in \[1, steps = 6\]"):
        stability_ablation([1], [0], steps=6, every=9)
    with pytest.raises(ValueError, match="need at least one depth"):
        stability_ablation([], [0])


def test_the_shipped_ablation_loads_and_is_complete():
    from transformer_lib.stability import load_stability_ablation

    result = load_stability_ablation()
    settings, runs = result["settings"], result["runs"]
    assert result["command"].startswith("python bench/stability_ablation.py")
    assert result["seconds"] > 0
    expected = {(d, n, s, seed) for d in settings["depths"] for n in ("post", "pre")
                for s in ("noam", "no-warmup") for seed in settings["seeds"]}
    assert {(r["depth"], r["norm"], r["schedule"], r["seed"]) for r in runs} == expected
    assert len(runs) == len(expected) >= 4 * 3 * 5  # three depths, five seeds at least
    points = -(-settings["steps"] // settings["every"])
    assert all(len(r["loss"]) == len(r["grad_norm"]) == points for r in runs)


@pytest.mark.train
def test_the_ablation_script_writes_what_the_loader_reads(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "bench" / "stability_ablation.py"
    shown = subprocess.run([sys.executable, str(script), "--help"], capture_output=True,
                           text=True, check=True).stdout
    assert "--depths" in shown and "--seeds" in shown
    out = tmp_path / "small.json"
    done = subprocess.run([sys.executable, str(script), "--depths", "1", "--seeds", "1",
                           "--steps", "5", "--batch-size", "4", "--out", str(out)],
                          capture_output=True, text=True, check=True).stdout
    assert "4 runs in" in done and str(out) in done
    result = json.loads(out.read_text())
    assert result["command"] == ("python bench/stability_ablation.py --depths 1 --seeds 1 "
                                 f"--steps 5 --batch-size 4 --out {out}")
    assert len(result["runs"]) == 4 and result["settings"]["steps"] == 5
