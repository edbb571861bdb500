"""``spindle fmt SPEC...``: rewrite specs in the canonical layout (see ``language.fmt``).

Like black: files are rewritten in place (atomically), ``--check`` writes nothing and exits 1
when a file would change, ``--diff`` prints what would change, and ``-`` formats stdin to
stdout. A file with syntax errors is reported and left alone; formatting needs only a
syntactically valid spec, not a semantically valid one.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys

from spindle_dsl.errors import SpecError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "specs", nargs="+", metavar="SPEC", help="a .spindle file ('-' reads stdin, writes stdout)"
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any file would change"
    )
    parser.add_argument("--diff", action="store_true", help="write nothing; print a unified diff")


def run(args: argparse.Namespace) -> int:
    from spindle_dsl.atomic import write_atomic
    from spindle_dsl.language import format_spec, parse, read_spec_text

    failed = would_change = False
    for path in args.specs:
        try:
            text = sys.stdin.read() if path == "-" else read_spec_text(path)
            out = format_spec(parse(text, "<stdin>" if path == "-" else path))
        except SpecError as exc:
            print(exc.render(), file=sys.stderr)
            failed = True
            continue
        if path == "-" and not (args.check or args.diff):
            sys.stdout.write(out)
            continue
        if out == text:
            continue
        would_change = True
        if args.diff:
            sys.stdout.writelines(
                difflib.unified_diff(
                    text.splitlines(keepends=True),
                    out.splitlines(keepends=True),
                    fromfile=path,
                    tofile=f"{path} (formatted)",
                )
            )
        if args.check or args.diff:
            print(f"would reformat {path}", file=sys.stderr)
        else:
            mode = os.stat(path).st_mode & 0o7777
            write_atomic(path, out)
            os.chmod(path, mode)  # the temporary file write_atomic renames over it is 0600
            print(f"reformatted {path}", file=sys.stderr)
    return 1 if failed or (args.check and would_change) else 0
