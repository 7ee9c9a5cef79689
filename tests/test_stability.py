"""Chapter 4's training-stability ablation (transformer_lib.stability): the sweep runs every
setting, the shipped results are complete, the bench script writes what the loader reads, and
the sweep shares train_reversal's defaults instead of repeating them."""
import inspect

import pytest
import torch

from transformer_lib import stability, tasks
from transformer_lib.tasks import evaluate_reversal, reversal_config, train_reversal


def test_the_sweep_lives_in_stability_only():
    """tasks no longer hands out stability's names (that re-export made the two modules import
    each other); each name has one home."""
    for name in ("stability_ablation", "load_stability_ablation", "ablation_table", "NORMS",
                 "ABLATION_FILE", "SOLVED_AT"):
        assert not hasattr(tasks, name), name
    assert not hasattr(stability, "NORMS") and not hasattr(stability, "ABLATION_FILE")
    assert stability.NORM_PLACEMENTS == ("post", "pre")
    assert stability.STABILITY_FILE == "stability_ablation.json"


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
    assert args.norms == list(defaults["norms"]) == ["post", "pre"]
    assert bench.parse_args(["--norms", "post"]).norms == ["post"]


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


def _run(depth, norm, schedule, seed, loss, exact, token, grad=1.0, curve=(3.0, 2.0)):
    return dict(depth=depth, norm=norm, schedule=schedule, seed=seed, final_loss=loss,
                exact_match=exact, token_accuracy=token, max_grad_norm=grad, finite=True,
                loss=list(curve))


def test_summarise_ablation_groups_by_setting_and_counts_the_solved_runs():
    from transformer_lib.stability import summarise_ablation

    runs = [_run(2, "post", "noam", 1, 0.7, 0.94, 0.98, grad=3.0),
            _run(2, "post", "noam", 0, 0.5, 0.95, 1.0, grad=7.5),
            _run(2, "pre", "no-warmup", 0, 0.6, 1.0, 1.0)]
    table = summarise_ablation(runs)
    assert set(table) == {(2, "post", "noam"), (2, "pre", "no-warmup")}
    row = table[2, "post", "noam"]
    assert row["seeds"] == [0, 1] and row["final_loss"] == [0.5, 0.7]  # in seed order
    assert row["exact_match"] == [0.95, 0.94] and row["token_accuracy"] == [1.0, 0.98]
    assert row["solved"] == 1 and row["max_grad_norm"] == 7.5  # 0.95 counts, 0.94 does not
    assert summarise_ablation(runs, solved_at=0.9)[2, "post", "noam"]["solved"] == 2
    with pytest.raises(ValueError, match="runs is empty"):
        summarise_ablation([])


def test_ablation_table_prints_medians_ranges_and_the_largest_gradient():
    from transformer_lib.stability import ablation_table

    runs = [_run(4, "pre", "noam", s, loss, 1.0, 1.0) for s, loss in enumerate((0.6, 0.5, 0.9))]
    runs += [_run(4, "post", "no-warmup", s, 2.0 + s / 10, 0.0, 0.1 + s / 10, grad=14.56)
             for s in range(3)]
    text = ablation_table(runs).splitlines()
    assert text[0].endswith("solved: exact match >= 0.95")
    # post before pre, medians then [lowest, highest]
    assert text[2].split() == ["4", "post,", "no", "warmup", "2.100", "[2.000,", "2.200]",
                               "0.20", "[0.10,", "0.30]", "0.00", "0/3"]
    assert text[3].split() == ["4", "pre,", "warmup", "0.600", "[0.500,", "0.900]", "1.00",
                               "[1.00,", "1.00]", "1.00", "3/3"]
    assert text[-1] == "largest gradient norm in any run: 14.6; every loss finite: yes"
    assert max(len(line) for line in text) <= 80
    runs[0]["finite"] = False
    assert ablation_table(runs).endswith("every loss finite: no")


def test_live_table_puts_a_live_run_next_to_the_saved_seed_and_the_saved_range():
    from transformer_lib.stability import live_table

    saved = [_run(4, "post", "noam", s, 0, 0, 0, curve=(3.0, 2.0 + s, 1.0)) for s in range(3)]
    live = [_run(4, "post", "noam", 1, 0, 0, 0, curve=(3.0, 2.5))]
    lines = live_table(live, saved).splitlines()
    assert lines[1].split() == ["4", "layers,", "post,", "warmup", "2.500", "3.000", "2.000",
                                "to", "4.000"]  # window 1: live 2.5, seed 1 saved 3.0
    live[0]["seed"] = 9  # no saved run of that seed: its column is a dash
    assert live_table(live, saved).splitlines()[1].split()[5] == "-"
    with pytest.raises(ValueError, match="no window 3 for depth 4"):
        live_table([_run(4, "post", "noam", 0, 0, 0, 0, curve=(1, 1, 1, 1))], saved)
    with pytest.raises(ValueError, match="live is empty"):
        live_table([], saved)


def test_run_label_and_a_sweep_of_one_placement():
    from transformer_lib.stability import run_label, stability_ablation

    assert run_label("post", "noam") == "post-norm, warmup"
    assert run_label("pre", "no-warmup", short=True) == "pre, no warmup"
    with pytest.raises(ValueError, match="got 'mid' and 'noam'"):
        run_label("mid", "noam")
    result = stability_ablation([1], [0], steps=2, batch_size=4, every=1, eval_n=4,
                                norms=["post"])
    assert [(r["norm"], r["schedule"]) for r in result["runs"]] == [
        ("post", "noam"), ("post", "no-warmup")]
    with pytest.raises(ValueError, match=r"norms must be a non-empty subset of \('post', "
                                         r"'pre'\), got \['both'\]"):
        stability_ablation([1], [0], norms=["both"])
    one = stability_ablation([1], [0], steps=2, batch_size=4, every=1, eval_n=4,
                             norms=["post"], schedules=["no-warmup"])
    assert [(r["norm"], r["schedule"]) for r in one["runs"]] == [("post", "no-warmup")]
    assert one["runs"][0]["loss"] == result["runs"][1]["loss"]  # the same run, alone
    with pytest.raises(ValueError, match=r"schedules must be a non-empty subset"):
        stability_ablation([1], [0], schedules=[])
