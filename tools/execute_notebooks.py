"""Execute the book's notebooks into its execute cache, several at a time.

    python tools/execute_notebooks.py [--workers N]

Jupyter Book executes a page's notebook while Sphinx reads it, one page after another, so a
build of the book keeps one core busy while the notebooks run. This script runs them first,
``--workers`` kernels at once (default: the number of cores), exactly as myst-nb's ``cache``
mode would (each in its own folder, the same timeout, no error allowed), and stores every
notebook that ran without error in the execute cache that the build then reads
(``tools/i18n/editions.py``'s ``CACHE``: the configs of every edition point myst-nb at it). The
build finds each page's outputs there and executes nothing; a notebook that failed here is
not stored, so the build executes it again itself and reports the failing cell in its log as
it always has. ``tools/build_book.py`` calls :func:`execute_into_cache` after emptying the
cache.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TIMEOUT = 300  # seconds per cell, when _config.yml sets none


def toc_notebooks(root: Path = ROOT) -> list[Path]:
    """The ``.ipynb`` pages of the table of contents, in the order the book lists them."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [root / f"{name}.ipynb" for name in files if (root / f"{name}.ipynb").exists()]


def cell_timeout(root: Path = ROOT) -> int:
    """The per-cell timeout of the book's configuration (``execute.timeout``)."""
    config = yaml.safe_load((root / "_config.yml").read_text(encoding="utf-8"))
    return int((config.get("execute") or {}).get("timeout", DEFAULT_TIMEOUT))


def _send_output_to(log_path: str | None) -> None:
    """In a worker: the kernels' own output (stdout and stderr, which they inherit) goes to
    ``log_path``, the build's log, not to the terminal."""
    if log_path is None:
        return
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def _execute(path: str, timeout: int) -> tuple[str, str | None, float, str | None]:
    """Run one notebook in its own folder, as myst-nb's cache mode does.

    Returns:
        ``(path, executed notebook as JSON or None, seconds, error or None)``.
    """
    import nbformat
    from jupyter_cache.executors.utils import single_nb_execution

    notebook = nbformat.read(path, as_version=4)
    result = single_nb_execution(notebook, cwd=str(Path(path).parent), timeout=timeout,
                                 allow_errors=False, meta_override=True)
    if result.err is not None:
        return path, None, result.time, f"{type(result.err).__name__}: {result.err}"
    return path, nbformat.writes(notebook), result.time, None


def execute_into_cache(cache_path: Path, notebooks: list[Path] | None = None,
                       workers: int | None = None, timeout: int | None = None,
                       log=print, output: Path | None = None) -> dict[Path, float]:
    """Execute ``notebooks`` (default: the book's) ``workers`` at a time and store each one that
    ran without error in the execute cache at ``cache_path``.

    Args:
        cache_path: the jupyter-cache folder the book's build reads (created if missing).
        notebooks: the notebooks to run; by default every ``.ipynb`` page of ``_toc.yml``.
        workers: kernels at once (default: the number of cores, at least 1).
        timeout: seconds per cell (default: ``execute.timeout`` of ``_config.yml``).
        log: where each notebook's line (seconds, or its error) is written.
        output: the file that gets the kernels' own output (default: this process's).

    Returns:
        The seconds each notebook that ran without error took. The others are left to the
        build, which executes them again and reports their failing cell.
    """
    import nbformat
    from jupyter_cache import get_cache
    from jupyter_cache.base import CacheBundleIn

    notebooks = toc_notebooks() if notebooks is None else list(notebooks)
    workers = max(1, workers or os.cpu_count() or 1)
    timeout = cell_timeout() if timeout is None else timeout
    cache = get_cache(str(cache_path))
    # The longest notebooks first, so that two workers finish at about the same time.
    order = sorted(notebooks, key=lambda p: p.stat().st_size, reverse=True)
    done: dict[Path, float] = {}
    with ProcessPoolExecutor(max_workers=min(workers, len(order) or 1),
                             initializer=_send_output_to,
                             initargs=(None if output is None else str(output),)) as pool:
        futures = [pool.submit(_execute, str(path), timeout) for path in order]
        for future in as_completed(futures):
            path, executed, seconds, error = future.result()
            name = Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else path
            if error is not None:
                log(f"  {name}: failed after {seconds:.0f} s ({error.splitlines()[0]}); "
                    "the build runs it again and shows the cell")
                continue
            record = cache.add_nb_to_project(path)
            cache.cache_notebook_bundle(
                CacheBundleIn(nbformat.reads(executed, as_version=4), record.uri,
                              data={"execution_seconds": seconds}),
                check_validity=False, overwrite=True)
            done[Path(path)] = seconds
            log(f"  {name}: {seconds:.0f} s")
    return done


def main(argv: list[str] | None = None) -> int:
    from i18n import editions

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=None,
                        help="kernels at once (default: the number of cores)")
    args = parser.parse_args(argv)
    start = time.monotonic()
    done = execute_into_cache(editions.CACHE, workers=args.workers)
    print(f"{len(done)} notebooks executed in {time.monotonic() - start:.0f} s")
    return 0 if len(done) == len(toc_notebooks()) else 1


if __name__ == "__main__":
    sys.exit(main())
