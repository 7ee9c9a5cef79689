"""The Gradescope autograders (``tools/gradescope.py``): what a chapter's zip holds, then end
to end without Gradescope: ``setup.sh`` in a fresh virtual environment (the library's source
overridden, as the setup cell's ``TRANSFORMER_LIB_SOURCE`` does), and ``run_autograder`` on
a class of submissions, each in a root of its own (``AUTOGRADER_ROOT``), its
``results.json`` checked against Gradescope's specification.

The end-to-end tests are slow (a fresh environment, a kernel per notebook): marked ``slow``.
As root (as Gradescope runs it) the kernels run as the account ``nobody``; the grader's own
user is tried too."""
from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest

import _gradescope_run  # tools/_gradescope_run.py
import grade  # tools/grade.py
import gradescope  # tools/gradescope.py
from book_support import ROOT
from grade_fixtures import (
    ENDLESS,
    plant_at_run_time,
    plant_fake_package,
    renamed,
    replaced_checker,
    with_cell,
)
from release import project_version
from setup_cell import install_source, repository, setup_cell_source

CHAPTER_ID = "01_attention"  # graded end to end: about 12 s alone on one core
CHAPTER = ROOT / "chapters" / f"{CHAPTER_ID}.ipynb"
STUDENT = ROOT / "exercises" / f"{CHAPTER_ID}.ipynb"
OTHER = ROOT / "exercises" / "02_qkv_roles.ipynb"
TIMEOUT = 60  # seconds per notebook in the end-to-end zip (the infinite loop waits this long)
ACCOUNT = "nobody"  # the unprivileged account of the end-to-end runs
STATUSES = {"passed", "failed"}
VISIBILITIES = {"hidden", "after_due_date", "after_published", "visible"}


def _zip_names(path: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(path) as archive:
        return {info.filename: info for info in archive.infolist()}


def _read(path: Path, name: str) -> str:
    with zipfile.ZipFile(path) as archive:
        return archive.read(name).decode("utf-8")


def test_a_zip_per_page_with_the_specifications_layout(tmp_path, capsys):
    """A chapter's number means all of its pages; a page's id means that page."""
    assert gradescope.main(["01", "2", "03_multi_head", "01_attention", "--out",
                            str(tmp_path)]) == 0
    zips = sorted(tmp_path.glob("*.zip"))
    assert [z.name for z in zips] == [f"{c}-autograder.zip" for c in
                                      ("01_attention", "01b_masks_and_cost", "02_qkv_roles",
                                       "02b_encoder_decoder", "03_multi_head")]
    expected = []
    for z in zips:
        chapter = z.name.removesuffix("-autograder.zip")
        exercises = gradescope.chapter_exercises(ROOT / "chapters" / f"{chapter}.ipynb", {})
        total = sum(e["points"] for e in exercises)
        expected.append(f"{z}: {len(exercises)} exercises, {total:g} points")
    assert capsys.readouterr().out.splitlines() == expected
    for path in zips:
        names = _zip_names(path)
        assert set(names) == {"setup.sh", "run_autograder", "grader/assignment.json",
                              *[f"grader/{name}" for name in gradescope.ENGINE]}
        for script in ("setup.sh", "run_autograder"):  # at the root, executable
            assert stat.S_IMODE(names[script].external_attr >> 16) == 0o755
        for name in gradescope.ENGINE:  # the engine itself, not a second copy
            assert _read(path, f"grader/{name}") == (ROOT / "tools" / name).read_text("utf-8")


def test_the_assignment_lists_the_chapters_exercises_and_their_points(tmp_path):
    known = grade.chapters()
    seen = set()
    for chapter in ("01_attention", "01b_masks_and_cost", "02_qkv_roles", "03_multi_head"):
        spec = json.loads(_read(gradescope.build(chapter, tmp_path, known),
                                "grader/assignment.json"))
        assert [(e["function"], e["checker"]) for e in spec["exercises"]] == \
            known[chapter].exercises
        levels = [e["level"] for e in spec["exercises"]]
        assert set(levels) <= set(gradescope.POINTS)
        seen |= set(levels)
        assert [e["points"] for e in spec["exercises"]] == [gradescope.POINTS[v] for v in levels]
        assert all(e["name"].startswith(f"{e['level']}: ") and
                   e["name"].endswith(f"({e['function']})") for e in spec["exercises"])
        assert spec["chapter"] == chapter and spec["title"] == known[chapter].title
        assert set(spec["chapters"]) == set(known) and spec["version"] == project_version()
        assert spec["timeout"] == gradescope.DEFAULT_TIMEOUT
        assert spec["test_visibility"] == "visible"
    assert seen == {"Warm-up", "Core", "Challenge"}


def test_points_and_who_sees_the_tests_are_settings(tmp_path, capsys):
    first = grade.chapters()[CHAPTER_ID].exercises[0][0]
    assert gradescope.main([CHAPTER_ID, "--out", str(tmp_path), "--points", "Core=4",
                            "--points", f"{first}=2.5", "--hide-tests-until-due",
                            "--timeout", "90"]) == 0
    spec = json.loads(_read(tmp_path / f"{CHAPTER_ID}-autograder.zip", "grader/assignment.json"))
    assert [e["points"] for e in spec["exercises"]] == [
        2.5 if e["function"] == first else 4 if e["level"] == "Core" else
        gradescope.POINTS[e["level"]] for e in spec["exercises"]]
    assert spec["exercises"][0]["points"] == 2.5 and 4 in [e["points"] for e in spec["exercises"]]
    assert spec["test_visibility"] == "after_due_date" and spec["timeout"] == 90
    capsys.readouterr()
    assert gradescope.main([CHAPTER_ID, "--out", str(tmp_path), "--points", "Core"]) == 2
    assert "--points takes NAME=N with N >= 0, got 'Core'" in capsys.readouterr().err
    assert gradescope.main([CHAPTER_ID, "--out", str(tmp_path), "--points", "Cor=2"]) == 2
    assert "neither a level nor an exercise: ['Cor']" in capsys.readouterr().err
    assert gradescope.main(["42", "--out", str(tmp_path)]) == 2
    assert "no chapter with exercises is '42'" in capsys.readouterr().err


def test_setup_installs_the_release_the_handouts_pin(tmp_path):
    script = _read(gradescope.build(CHAPTER_ID, tmp_path), "setup.sh")
    pin = install_source(repository()[0], f"v{project_version()}")
    assert pin in setup_cell_source(ref=f"v{project_version()}")  # the student copies' pin
    assert f'source="${{TRANSFORMER_LIB_SOURCE:-{pin}}}"' in script
    torch = next(line for line in (ROOT / "requirements.txt").read_text("utf-8").splitlines()
                 if line.startswith("torch=="))
    assert f'--index-url {gradescope.TORCH_INDEX} "{torch}"' in script
    assert not re.search(r"@[A-Z_]+@", script)  # every placeholder filled in


def test_the_same_chapters_give_the_same_bytes(tmp_path):
    first = gradescope.build(CHAPTER_ID, tmp_path / "a").read_bytes()
    assert gradescope.build(CHAPTER_ID, tmp_path / "b").read_bytes() == first


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_gradescope_builds_every_chapter_unless_told():
    def command(*settings):
        dry = subprocess.run(["make", "--no-print-directory", "-n", "-o",
                              ".venv/.installed-stamp", "gradescope", *settings],
                             cwd=ROOT, capture_output=True, text=True, check=True)
        return dry.stdout.strip().splitlines()[-1]

    assert command().endswith('tools/gradescope.py all --out "dist/gradescope"')
    assert command("CHAPTERS=01 03", "OUT=zips").endswith('gradescope.py 01 03 --out "zips"')


# End to end ---------------------------------------------------------------------------------

def _account_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


AS_ROOT = os.geteuid() == 0 and _account_exists(ACCOUNT)


def _as_account(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    account = pwd.getpwnam(ACCOUNT)
    return subprocess.run(command, user=account.pw_uid, group=account.pw_gid, extra_groups=[],
                          capture_output=True, text=True, **kwargs)


def _fresh_environment(base: Path) -> Path:
    """A virtual environment without packages of its own, made by a Python every account may
    run, that sees this environment's packages (``setup.sh`` then finds PyTorch and the
    rest installed, and downloads nothing); the library itself is left out."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    base_python = Path(f"/usr/bin/python{version}")
    if not base_python.exists():
        base_python = Path(getattr(sys, "_base_executable", sys.executable))
    env_dir = base / "venv"
    subprocess.run([str(base_python), "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = env_dir / "lib" / f"python{version}" / "site-packages"
    ours = Path(sysconfig.get_paths()["purelib"])
    (site / "course-env.pth").write_text(f"{ours}\n", encoding="utf-8")
    probe = [str(env_dir / "bin" / "python"), "-c", "import torch, nbclient"]
    if AS_ROOT and _as_account(probe).returncode != 0:
        # This environment's folder is closed to other accounts: hard links instead.
        (site / "course-env.pth").unlink()
        skip = shutil.ignore_patterns("transformer_lib*", "__editable__*", "__pycache__")
        try:
            shutil.copytree(ours, site, symlinks=True, ignore=skip, copy_function=os.link,
                            dirs_exist_ok=True)
        except OSError as exc:
            pytest.skip(f"{ACCOUNT} cannot run this environment's Python, and it cannot be "
                        f"linked into a fresh one ({exc})")
        failed = _as_account(probe)
        if failed.returncode != 0:
            pytest.skip(f"{ACCOUNT} cannot import torch from a fresh environment: "
                        f"{failed.stderr.strip()[-300:]}")
    return env_dir


@pytest.fixture(scope="module")
def environment():
    """``setup.sh`` of the chapter's zip run in a fresh environment, offline, the library
    installed from a wheel of this checkout: ``(base folder, zip, environment variables)``."""
    base = Path(tempfile.mkdtemp(prefix="gradescope-", dir="/tmp"))
    base.chmod(0o755)  # open: only the grader's own locks keep the kernel out
    try:
        archive = gradescope.build(CHAPTER_ID, base / "zip", timeout=TIMEOUT)
        env_dir = _fresh_environment(base)
        checkout = base / "checkout"  # what `git+URL@tag` would fetch
        checkout.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE", "LICENSE-TEXT"):
            shutil.copy2(ROOT / name, checkout / name)
        shutil.copytree(ROOT / "transformer_lib", checkout / "transformer_lib",
                        ignore=shutil.ignore_patterns("__pycache__"))
        python = str(env_dir / "bin" / "python")
        subprocess.run([python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index",
                        "--no-build-isolation", "-w", str(base / "wheel"), str(checkout)],
                       check=True, capture_output=True)
        wheel = next((base / "wheel").glob("transformer_lib-*.whl"))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "VIRTUAL_ENV", "JUPYTER", "IPYTHON"))}
        env.update(PATH=f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                   PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", HF_HUB_OFFLINE="1",
                   AUTOGRADER_USER=ACCOUNT, TRANSFORMER_LIB_SOURCE=str(wheel))
        source = base / "setup"
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(source)
        setup = subprocess.run(["bash", str(source / "setup.sh")], env=env, cwd=source,
                               capture_output=True, text=True, timeout=600)
        assert setup.returncode == 0, setup.stdout[-3000:] + setup.stderr[-3000:]
        yield base, archive, env, setup.stdout
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_setup_installs_the_library_into_the_environment_on_path(environment):
    base, _, env, out = environment
    assert f"grading with transformer_lib {project_version()}" in out
    found = subprocess.run(["python3", "-c", "import transformer_lib; print(transformer_lib"
                            ".__file__)"], env=env, cwd=base, capture_output=True, text=True,
                           check=True)
    assert found.stdout.startswith(str(base / "venv")), found.stdout  # not this checkout's


def _unpack(archive: Path, root: Path) -> None:
    """Lay out ``root`` as Gradescope does: the zip in ``source/``, ``run_autograder`` copied
    to the root, ``submission/`` and ``results/`` made."""
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(root / "source")
    shutil.copy2(root / "source" / "run_autograder", root / "run_autograder")
    (root / "submission").mkdir()
    (root / "results").mkdir()


def _probe(root: Path, report: Path) -> str:
    """A cell that tries to write ``results.json`` and to read the grader's files, and writes
    what happened (``done`` or the exception's name) to ``report``."""
    targets = {"write results": ("open", str(root / "results" / "results.json"), "w"),
               "read source": ("open", str(root / "source" / "grader" / "assignment.json"), "r"),
               "list submission": ("listdir", str(root / "submission"), "")}
    return f"""
import json, os
found = {{}}
for what, (how, path, mode) in {targets!r}.items():
    try:
        if how == "open":
            with open(path, mode) as f:
                f.write('{{"score": 100}}') if mode == "w" else f.read()
        else:
            os.listdir(path)
        found[what] = "done"
    except OSError as exc:
        found[what] = type(exc).__name__
with open({str(report)!r}, "w") as f:
    json.dump(found, f)
"""


def _run(archive: Path, env: dict, root: Path, files: dict, as_account: bool = False) -> dict:
    """``run_autograder`` in ``root`` on the submission ``files`` (name -> notebook, text or
    folder maker); ``results.json`` and the run's stdout."""
    _unpack(archive, root)
    for name, content in files.items():
        target = root / "submission" / name
        if callable(content):
            content(root / "submission")
        elif isinstance(content, str):
            target.write_text(content, encoding="utf-8")
        else:
            nbformat.write(content, target)
    env = {**env, "AUTOGRADER_ROOT": str(root)}
    command = ["bash", str(root / "run_autograder")]
    if as_account:  # the grader not started as root: the whole root is the account's
        account = pwd.getpwnam(ACCOUNT)
        for path in [root, *root.rglob("*")]:
            os.chown(path, account.pw_uid, account.pw_gid)
        env["HOME"] = str(root)
        run = _as_account(command, env=env, cwd=root, timeout=3 * TIMEOUT + 120)
    else:
        run = subprocess.run(command, env=env, cwd=root, capture_output=True, text=True,
                             timeout=3 * TIMEOUT + 120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    results = json.loads((root / "results" / "results.json").read_text(encoding="utf-8"))
    return {"results": results, "stdout": run.stdout}


@pytest.fixture(scope="module")
def graded(environment):
    """Every submission of the class through ``run_autograder``, two at a time."""
    base, archive, env, _ = environment
    exercises = grade.chapters()[CHAPTER_ID].exercises
    # The last exercise: no other exercise of the chapter calls it (the first ones are the
    # core pieces the later ones build on), so renaming or breaking it fails it alone.
    first, first_checker = exercises[-1]
    probes = base / "probes"  # where the notebooks' probe writes (any account may)
    probes.mkdir(mode=0o777)
    probes.chmod(0o777)
    roots = base / "roots"
    roots.mkdir()
    roots.chmod(0o755)
    carol = with_cell(STUDENT, replaced_checker(first, first_checker))
    carol.cells.append(nbformat.v4.new_code_cell(_probe(roots / "carol", probes / "carol.json")))
    class_ = {
        "alice": {f"{CHAPTER_ID}.ipynb": nbformat.read(CHAPTER, as_version=4)},
        "bob": {f"{CHAPTER_ID}.ipynb": nbformat.read(STUDENT, as_version=4)},
        "carol": {f"{CHAPTER_ID}.ipynb": carol},
        "dave": {f"{CHAPTER_ID}.ipynb": with_cell(STUDENT, ENDLESS, index=3)},
        # The kernel dies before the exercises: the grader says so (a full run of the chapter
        # that dies at its end is the grader's test, on chapter 0).
        "eve": {f"{CHAPTER_ID}.ipynb": with_cell(CHAPTER, "import os\nos._exit(1)", index=3)},
        "frank": {f"{CHAPTER_ID}.ipynb": "{ this is not json"},
        "grace": {f"Copy of {CHAPTER_ID} (1).ipynb": renamed(  # found by its title
            nbformat.read(CHAPTER, as_version=4), first, f"my_{first}")},
        "heidi": {"02_qkv_roles.ipynb": nbformat.read(OTHER, as_version=4)},
        "nia": {f"{CHAPTER_ID}.ipynb": with_cell(CHAPTER, plant_at_run_time(first)),
                "transformer_lib": plant_fake_package},  # uploaded beside it too
        "kim": {"answers.py": "print('no notebook here')\n"},
    }
    runs = {}
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_run, archive, env, roots / name, files)
                   for name, files in class_.items()}
        if AS_ROOT:
            futures["alice as the grader"] = pool.submit(
                _run, archive, env, roots / "alice-as-the-grader", class_["alice"], True)
        for name, future in futures.items():
            runs[name] = future.result()
    probe = probes / "carol.json"
    runs["carol"]["probe"] = json.loads(probe.read_text("utf-8")) if probe.exists() else None
    return runs


def _assert_specification(results: dict) -> None:
    """``results.json`` as Gradescope's autograder specification describes it."""
    assert set(results) == {"score", "execution_time", "output", "visibility",
                            "stdout_visibility", "tests"}
    assert isinstance(results["execution_time"], int) and results["execution_time"] >= 0
    assert isinstance(results["output"], str) and results["output"]
    assert results["visibility"] in VISIBILITIES and results["stdout_visibility"] == "hidden"
    for number, test in enumerate(results["tests"], start=1):
        assert set(test) == {"name", "number", "score", "max_score", "status", "output",
                             "visibility"}
        assert test["number"] == str(number) and test["status"] in STATUSES
        assert test["score"] == (test["max_score"] if test["status"] == "passed" else 0)
        assert test["visibility"] in VISIBILITIES and test["output"]
    assert results["score"] == sum(test["score"] for test in results["tests"])


def _points() -> list[int]:
    """The points of the graded chapter's exercises, in page order, from their levels."""
    return [e["points"] for e in gradescope.chapter_exercises(CHAPTER, {})]


@pytest.mark.slow
def test_every_results_file_follows_the_specification(graded):
    names = [fn for fn, _ in grade.chapters()[CHAPTER_ID].exercises]
    for name, run in graded.items():
        _assert_specification(run["results"])
        tests = run["results"]["tests"]
        assert [t["name"].rsplit("(", 1)[1].rstrip(")") for t in tests] == names, name
        assert [t["max_score"] for t in tests] == _points(), name


@pytest.mark.slow
def test_the_full_solution_earns_every_point(graded):
    results = graded["alice"]["results"]
    assert results["score"] == sum(_points()), [t["output"] for t in results["tests"]]
    assert {t["status"] for t in results["tests"]} == {"passed"}
    assert all("checks passed" in t["output"] for t in results["tests"])
    n = len(_points())
    assert f"{n} of {n} exercises passed" in results["output"]
    if AS_ROOT:
        assert f"the kernel runs as {ACCOUNT}" in graded["alice"]["stdout"]


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason=f"needs root and the account {ACCOUNT}")
def test_started_as_another_user_the_kernel_runs_as_that_user(graded):
    run = graded["alice as the grader"]
    assert run["results"]["score"] == sum(_points())
    assert f"not root (uid {pwd.getpwnam(ACCOUNT).pw_uid})" in run["stdout"]


@pytest.mark.slow
def test_the_untouched_copy_earns_nothing_and_says_not_attempted(graded):
    results = graded["bob"]["results"]
    assert results["score"] == 0 and f"0 of {len(_points())} exercises passed" in results["output"]
    assert all("not attempted yet" in t["output"] for t in results["tests"])


@pytest.mark.slow
def test_a_replaced_checker_and_a_printed_pass_earn_nothing(graded):
    results = graded["carol"]["results"]
    assert results["score"] == 0
    assert results["tests"][-1]["status"] == "failed"  # the exercise whose checker it replaced
    assert "all 3 checks passed" not in results["tests"][-1]["output"]


@pytest.mark.slow
@pytest.mark.skipif(not AS_ROOT, reason=f"needs root and the account {ACCOUNT}")
def test_the_notebook_can_neither_write_the_results_nor_read_the_graders_files(graded):
    assert graded["carol"]["probe"] == {"write results": "PermissionError",
                                        "read source": "PermissionError",
                                        "list submission": "PermissionError"}
    assert '"score": 100' not in json.dumps(graded["carol"]["results"])


@pytest.mark.slow
def test_an_infinite_loop_is_stopped_at_the_time_limit(graded):
    results = graded["dave"]["results"]
    assert results["score"] == 0
    assert f"did not finish within the time limit of {TIMEOUT} s" in results["output"]
    assert all(t["output"].endswith("not graded: time limit.") for t in results["tests"])


@pytest.mark.slow
def test_a_notebook_that_kills_its_kernel_is_reported(graded):
    results = graded["eve"]["results"]
    assert results["score"] == 0 and "stopped before the end" in results["output"]


@pytest.mark.slow
def test_invalid_json_is_not_a_notebook(graded):
    results = graded["frank"]["results"]
    assert results["score"] == 0 and results["execution_time"] < TIMEOUT
    assert results["output"].startswith(f"{CHAPTER_ID}.ipynb is not a Jupyter notebook")


@pytest.mark.slow
def test_a_renamed_copy_is_graded_and_a_renamed_function_is_missing(graded):
    results = graded["grace"]["results"]
    *others, renamed_one = results["tests"]
    assert renamed_one["status"] == "failed"
    assert "not defined in the notebook" in renamed_one["output"]
    assert {t["status"] for t in others} == {"passed"}
    assert results["score"] == sum(_points()[:-1])


@pytest.mark.slow
def test_another_chapters_notebook_is_named_and_not_run(graded):
    results = graded["heidi"]["results"]
    assert results["score"] == 0 and results["execution_time"] < TIMEOUT
    assert ("02_qkv_roles.ipynb is the notebook of chapter 02_qkv_roles" in results["output"]
            and f"this assignment grades chapter {CHAPTER_ID}" in results["output"])


@pytest.mark.slow
def test_a_planted_transformer_lib_package_is_not_imported(graded):
    """The planted checkers pass everything; the installed one fails the wrong function."""
    results = graded["nia"]["results"]
    function = grade.chapters()[CHAPTER_ID].exercises[-1][0]
    *others, planted = results["tests"]
    assert planted["status"] == "failed"
    assert re.match(rf"{function}: \d+ of \d+ checks passed", planted["output"])  # the real one
    assert {t["status"] for t in others} == {"passed"}


@pytest.mark.slow
def test_a_submission_without_a_notebook_says_what_to_upload(graded):
    results = graded["kim"]["results"]
    assert results["score"] == 0
    assert results["output"].startswith("No notebook (.ipynb) was found in the submission")


def test_results_of_a_graded_row_by_hand():
    """``results`` alone: a passed, a failed and a missing exercise."""
    spec = {"chapter": "01_x", "title": "X", "timeout": 9, "test_visibility": "after_due_date",
            "chapters": {"01_x": {"title": "X", "exercises": []}},
            "exercises": [{"function": f, "name": f"{f} test", "points": p}
                          for f, p in (("f", 1), ("g", 2), ("h", 3))]}
    row = grade.Row("s", "01_x.ipynb", "01_x", results={
        "f": grade.Result.PASS, "g": grade.Result.FAIL, "h": grade.Result.MISSING},
        reports={"f": "f: all 2 checks passed.", "g": "g: 1 of 2 checks failed.",
                 "h": "h: not defined in the notebook."})
    results = _gradescope_run.results(row, spec, 3.6)
    _assert_specification(results)
    assert [(t["score"], t["status"]) for t in results["tests"]] == [
        (1, "passed"), (0, "failed"), (0, "failed")]
    assert results["score"] == 1 and results["execution_time"] == 4
    assert {t["visibility"] for t in results["tests"]} == {"after_due_date"}
    assert results["output"] == ("Chapter 01_x (X): 1 of 3 exercises passed, 1 of 6 points. "
                                 "Each test shows its checker's report.")


def test_of_several_files_the_chapters_notebook_is_graded(tmp_path):
    spec = json.loads(_read(gradescope.build(CHAPTER_ID, tmp_path / "zip"),
                            "grader/assignment.json"))
    submission = tmp_path / "submission"
    (submission / "notes").mkdir(parents=True)
    nbformat.write(nbformat.read(OTHER, as_version=4), submission / "02_qkv_roles.ipynb")
    (submission / "a.ipynb").write_text("{ not json", encoding="utf-8")
    assert _gradescope_run.find_notebook(submission, spec) == submission / "02_qkv_roles.ipynb"
    ours = submission / "notes" / f"Copy of {CHAPTER_ID}.ipynb"
    nbformat.write(nbformat.read(STUDENT, as_version=4), ours)
    assert _gradescope_run.find_notebook(submission, spec) == ours
    assert _gradescope_run.find_notebook(tmp_path / "zip", spec) is None
