"""Run one submitted notebook in a fresh kernel, then grade it in that kernel.

    python tools/_grade_runner.py NOTEBOOK --results FILE --library DIR --timeout SECONDS \\
        --exercise FUNCTION:CHECKER [--exercise ...] [--untrusted DIR ...] [--user NAME]

``tools/grade.py`` starts this program once per notebook, in a process of its own, with the
kernel's working directory as its own. The notebook runs top to bottom (a cell that raises
does not stop it); then one more cell, the source of :func:`grade_in_kernel` and a call to it,
grades the exercises in the same kernel and writes their results to ``FILE`` as JSON.

``DIR`` is the folder of the installed ``transformer_lib`` package, as the grading process
found it. The grading cell takes ``''``, the kernel's working directory and every folder given
with ``--untrusted`` (the submission's) off ``sys.path``, drops every ``transformer_lib``
module the notebook imported or replaced, and loads the package again from ``DIR`` alone. If
``transformer_lib.checks`` or a checker still comes from anywhere else, nothing is graded:
``FILE`` then holds ``{"tampered": "<why>"}``.

With ``--user`` (this program then runs as root, as on Gradescope) the kernel runs as that
unprivileged account: its connection file is written into the working directory, which is
then handed over to the account (owner, mode 700) and is the kernel's home too.
The grader's files and the final results stay out of the notebook's reach; the results file
of the grading cell is the kernel's, in its working directory.

Exit status: 0 when the notebook and the grading cell ran, 3 when the kernel died, 2 for bad
arguments; anything else is a failure of this program (its traceback is on stderr).
"""
from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

KERNEL_DIED = 3


def grade_in_kernel(namespace: dict, exercises: list[tuple[str, str]], out_path: str,
                    library: str, untrusted: list[str]) -> None:
    """Grade the notebook's functions with the installed checkers; runs inside the kernel.

    Its source is sent to the kernel as a cell, so it imports what it needs itself.

    Args:
        namespace: the notebook's globals, where its functions are.
        exercises: (function, checker) pairs of the notebook's chapter.
        out_path: where the results go, as JSON: function -> {"result", "report"}, or
            {"tampered": why} when the checkers are not the installed ones.
        library: the folder of the installed ``transformer_lib`` package.
        untrusted: folders whose code must not be imported (the submission's).
    """
    import importlib
    import importlib.util
    import json
    import os
    import sys

    library = os.path.realpath(library)

    def inside(path: str, folder: str) -> bool:
        path = os.path.realpath(path)
        return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)

    def write(results: dict) -> None:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(results, f)

    roots = [os.path.realpath(p) for p in (os.getcwd(), *untrusted)]
    sys.path[:] = [p for p in sys.path
                   if p not in ("", ".") and not any(inside(p, root) for root in roots)]
    ours = [m for m in sys.modules if m == "transformer_lib" or m.startswith("transformer_lib.")]
    for name in ours:  # imported, replaced or patched by the notebook: load them afresh
        del sys.modules[name]
    spec = importlib.util.spec_from_file_location(
        "transformer_lib", os.path.join(library, "__init__.py"),
        submodule_search_locations=[library])
    package = importlib.util.module_from_spec(spec)
    sys.modules["transformer_lib"] = package
    spec.loader.exec_module(package)
    checks = importlib.import_module("transformer_lib.checks")
    sources = {"transformer_lib.checks": getattr(checks, "__file__", None) or "<no file>"}
    for _, checker in exercises:
        module = sys.modules.get(getattr(getattr(checks, checker, None), "__module__", ""), None)
        sources[checker] = getattr(module, "__file__", None) or "<no file>"
    foreign = {name: path for name, path in sources.items() if not inside(path, library)}
    if foreign:
        name, path = next(iter(foreign.items()))
        write({"tampered": f"{name} was loaded from {path}, not from the installed library "
                           f"({library})"})
        return
    results = {}
    for function, checker in exercises:
        fn = namespace.get(function)
        if not callable(fn) or getattr(fn, "__module__", None) != "__main__":
            results[function] = {"result": "missing",
                                 "report": f"{function}: not defined in the notebook."}
            continue
        result = getattr(checks, checker)(fn)
        outcome = "pass" if result.passed is True else (
            "fail" if result.attempted else "not attempted")
        results[function] = {"result": outcome, "report": str(result.report)}
    write(results)


def grading_cell(exercises: list[tuple[str, str]], out_path: str, library: str,
                 untrusted: list[str]) -> str:
    """The source of the cell appended to the notebook: :func:`grade_in_kernel`, then a call
    to it on the notebook's globals with these arguments."""
    call = (f"grade_in_kernel(globals(), {list(exercises)!r}, {out_path!r}, {library!r}, "
            f"{list(untrusted)!r})")
    return inspect.getsource(grade_in_kernel) + "\n\n" + call + "\n"


def _as_user(user: str) -> tuple[type, dict]:
    """The kernel manager class and the launch options that start the kernel as ``user``.

    Returns:
        A kernel manager whose connection file (the kernel's ports and key) is written into
        the working directory, which it then hands over to ``user`` with the file (written
        first, while no process of ``user`` can reach the folder); and ``Popen``'s options
        for the kernel: the account's ids without root's groups, and its own environment."""
    import os
    import pwd

    from jupyter_client.manager import AsyncKernelManager

    account = pwd.getpwnam(user)
    home = str(Path.cwd())

    class DroppedKernelManager(AsyncKernelManager):
        def write_connection_file(self, **kwargs) -> None:
            self.connection_file = os.path.join(home, "kernel-connection.json")
            super().write_connection_file(**kwargs)
            for path in (self.connection_file, home):
                os.chown(path, account.pw_uid, account.pw_gid)
            os.chmod(home, 0o700)

    env = {key: value for key, value in os.environ.items() if not key.startswith("XDG_")}
    env.update(HOME=home, USER=user, LOGNAME=user)  # root's folders are not the kernel's
    options = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": [], "env": env}
    return DroppedKernelManager, options


def run(notebook: Path, results: Path, library: Path, exercises: list[tuple[str, str]],
        timeout: float, untrusted: list[Path], user: str | None = None) -> int:
    """Execute ``notebook`` and the grading cell in a fresh ``python3`` kernel whose working
    directory is this process's, as ``user`` if given; returns the exit status (0, or
    ``KERNEL_DIED``)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(notebook, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(grading_cell(
        exercises, str(results), str(library), [str(p) for p in untrusted])))
    manager, options = _as_user(user) if user is not None else (None, {})
    client = NotebookClient(nb, timeout=int(timeout), allow_errors=True, kernel_name="python3",
                            resources={"metadata": {"path": str(Path.cwd())}},
                            **({"kernel_manager_class": manager} if manager else {}))
    try:
        client.execute(**options)
    except DeadKernelError:
        return KERNEL_DIED
    return 0


def _exercise(text: str) -> tuple[str, str]:
    function, sep, checker = text.partition(":")
    if not (sep and function.isidentifier() and checker.isidentifier()):
        raise argparse.ArgumentTypeError(f"expected FUNCTION:CHECKER, got {text!r}")
    return function, checker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--results", type=Path, required=True, help="the results file to write")
    parser.add_argument("--library", type=Path, required=True,
                        help="the folder of the installed transformer_lib package")
    parser.add_argument("--timeout", type=float, required=True, help="seconds per cell")
    parser.add_argument("--exercise", type=_exercise, action="append", required=True,
                        help="FUNCTION:CHECKER, once per exercise")
    parser.add_argument("--untrusted", type=Path, action="append", default=[],
                        help="a folder whose code the grading must not import")
    parser.add_argument("--user", help="the unprivileged account the kernel runs as (as root)")
    args = parser.parse_args(argv)
    if not (args.library / "__init__.py").is_file():
        parser.error(f"--library {args.library} is not a package folder")
    if args.user is not None:
        import os
        import pwd

        if os.geteuid() != 0:
            parser.error(f"--user {args.user} needs root, but this runs as uid {os.geteuid()}")
        try:
            pwd.getpwnam(args.user)
        except KeyError:
            parser.error(f"--user {args.user}: no such account")
    return run(args.notebook, args.results, args.library, args.exercise, args.timeout,
               args.untrusted, args.user)


if __name__ == "__main__":
    sys.exit(main())
