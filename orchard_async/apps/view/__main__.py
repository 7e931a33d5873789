"""``python -m orchard_async.apps.view RUN [RUN2] [--port N] [--no-open]``: the ``view`` command
without going through ``orchard-async`` (same arguments, same one-line errors, exit 2)."""

from __future__ import annotations

import sys

from orchard_async.apps.cli import OneLineParser, orchard_leaf, report_error
from orchard_async.apps.view.cli import add_view_command


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="orchard-async view")
    add_view_command(parser)
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except BaseException as error:
        leaf = orchard_leaf(error)
        if leaf is None:
            raise
        return report_error(leaf)


if __name__ == "__main__":
    sys.exit(main())
