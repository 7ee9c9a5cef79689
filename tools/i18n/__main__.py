"""The i18n tools' command line: ``python tools/i18n COMMAND ...`` (``--help`` lists them)."""
from __future__ import annotations

import sys
from pathlib import Path

# Run as a folder, the package's own folder is on the path: put tools/ there instead.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from i18n import editions, fonts, messages, notebooks  # noqa: E402


def _config(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="tools/i18n config",
                                     description=editions.__doc__.splitlines()[0])
    parser.add_argument("kind", choices=editions.kinds())
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    print(editions.write(args.kind, args.out))
    return 0


COMMANDS = {"config": _config, "messages": messages.main, "notebooks": notebooks.main,
            "fonts": fonts.main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: tools/i18n {{{','.join(COMMANDS)}}} ...\n\n{__package__ or 'i18n'}: "
              "the book's editions in other languages (see tools/i18n/__init__.py)",
              file=sys.stdout if argv[:1] in (["-h"], ["--help"]) else sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return COMMANDS[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
