"""`dslc`, the command line (LANGUAGE.md §11). User errors exit 1, usage errors 2."""
from __future__ import annotations

import argparse
import sys
import traceback

from frontend.check import check_file
from frontend.diagnostics import DslError

REPORT = "this is a bug in dslc: please report it with the input that caused it"


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version
    try:
        return dist_version("dslc")
    except PackageNotFoundError:
        return "0+unknown"


def cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            check_file(path)
        except DslError as e:
            print(e, file=sys.stderr)
            failed = True
    return 1 if failed else 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dslc", description="The dslc tensor-language compiler.")
    p.add_argument("--version", action="version", version=f"dslc {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("check", help="parse and type-check files; print diagnostics")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(run=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except KeyboardInterrupt:
        return 130
    except Exception:
        traceback.print_exc()
        print(f"dslc: internal error: {REPORT}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
