"""Write the Markdown command-line reference (``docs/cli.md``) from the argument parsers.

The reference is generated, not written, so that it cannot drift from what ``spindle COMMAND
--help`` says: every command's section comes from the same ``add_arguments`` the command runs
with, and ``tests/core/test_docs.py`` fails when the committed file differs from a fresh one.

Run ``python -m spindle_dsl.cli.docs --out docs/cli.md`` (or ``make docs``); without ``--out``
the Markdown goes to stdout. The output is deterministic: usage lines are wrapped at a fixed
width (not the terminal's), and the tables are built from the parsers' actions, so neither
``COLUMNS`` nor the machine's core count or paths change a byte.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import spindle_dsl.cli as cli
from spindle_dsl.atomic import write_atomic

# Usage lines are wrapped at this width whatever the terminal: it fits a GitHub code block.
USAGE_WIDTH = 88

REGENERATE = "python -m spindle_dsl.cli.docs --out docs/cli.md"


@dataclass(frozen=True)
class ArgumentRow:
    """One argument as a table row: the cells are Markdown already."""

    flags: str
    value: str
    default: str
    help: str


@dataclass(frozen=True)
class ArgumentGroup:
    """The rows of one argparse argument group, under its title."""

    title: str
    rows: tuple[ArgumentRow, ...]


@dataclass(frozen=True)
class CommandDoc:
    """What one command's section shows; ``children`` are its own sub-commands."""

    prog: str
    help: str
    description: str
    example: str
    usage: str
    groups: tuple[ArgumentGroup, ...]
    children: tuple[CommandDoc, ...]


def anchor(prog: str) -> str:
    """The GitHub anchor of the heading `` `prog` `` (its words joined by '-')."""
    if not re.fullmatch(r"[a-z0-9_ -]+", prog):
        raise ValueError(f"command name {prog!r} would need GitHub's full anchor rules")
    return prog.replace(" ", "-")


def _fixed_width(
    formatter_class: Callable[..., argparse.HelpFormatter],
) -> Callable[..., argparse.HelpFormatter]:
    """``formatter_class`` with its width pinned, so that ``COLUMNS`` changes nothing."""
    return functools.partial(formatter_class, width=USAGE_WIDTH)


def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser ``spindle NAME`` parses with, built the way ``cli.main`` builds it, but with
    every formatter (its sub-commands' too) at the fixed width."""
    module = importlib.import_module(f"spindle_dsl.cli.cmd_{name}")
    parser = cli._command_parser(name)
    # before add_arguments: sub-command progs are formatted when add_subparsers is called
    parser.formatter_class = _fixed_width(parser.formatter_class)
    module.add_arguments(parser)
    for _name, child, _help in _subcommands(parser):
        child.formatter_class = _fixed_width(child.formatter_class)
    return parser


def _subcommands(
    parser: argparse.ArgumentParser,
) -> list[tuple[str, argparse.ArgumentParser, str]]:
    """(name, parser, one-line help) of every sub-command ``parser`` has, in their order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            out += [(name, sub, helps.get(name, "")) for name, sub in action.choices.items()]
    return out


def describe(parser: argparse.ArgumentParser, help_text: str, example: str = "") -> CommandDoc:
    """The section of ``parser`` (recursing into its sub-commands)."""
    children = tuple(describe(sub, sub_help) for _name, sub, sub_help in _subcommands(parser))
    groups = tuple(
        ArgumentGroup(group.title[:1].upper() + group.title[1:], rows)
        for group in parser._action_groups
        if group.title and (rows := _rows(parser, group._group_actions))
    )
    return CommandDoc(
        prog=parser.prog,
        help=help_text,
        description=parser.description or "",
        example=example,
        usage=parser.format_usage().strip(),
        groups=groups,
        children=children,
    )


def _rows(
    parser: argparse.ArgumentParser, actions: Iterable[argparse.Action]
) -> tuple[ArgumentRow, ...]:
    return tuple(_row(parser, a) for a in actions if a.help is not argparse.SUPPRESS)


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> ArgumentRow:
    help_text = _markdown(_expand_help(parser, action))
    if isinstance(action, argparse._SubParsersAction):
        links = ", ".join(
            f"[`{name}`](#{anchor(sub.prog)})" for name, sub in action.choices.items()
        )
        help_text = f"{help_text} one of: {links}".strip()
    excluded = _excluded_with(parser, action)
    if excluded:
        help_text = f"{help_text}; not with {excluded}" if help_text else f"not with {excluded}"
    if action.option_strings:
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
        value = _code(_format_nargs(action, _metavar(action))) if action.nargs != 0 else ""
    else:
        flags, value = _code(_format_nargs(action, _metavar(action))), ""
    return ArgumentRow(flags, value, _default(action), help_text)


def _metavar(action: argparse.Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def _format_nargs(action: argparse.Action, metavar: str) -> str:
    nargs = action.nargs
    if nargs is None:
        return metavar
    if nargs == argparse.OPTIONAL:
        return f"[{metavar}]"
    if nargs == argparse.ZERO_OR_MORE:
        return f"[{metavar} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{metavar} [{metavar} ...]"
    if nargs in (argparse.PARSER, argparse.REMAINDER):
        return f"{metavar} ..."
    return " ".join([metavar] * int(nargs))


def _expand_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """``action.help`` with ``%(default)s`` and the like filled in, as argparse fills them."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = parser.prog
    for key, value in params.items():
        if hasattr(value, "__name__"):
            params[key] = value.__name__
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(choice) for choice in params["choices"])
    return " ".join((action.help % params).split())


def _excluded_with(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """The options ``action`` may not be given with (a mutually exclusive group), as Markdown."""
    others: list[str] = []
    for group in parser._mutually_exclusive_groups:
        if action in group._group_actions:
            others += [f"`{a.option_strings[-1]}`" for a in group._group_actions if a is not action]
    return ", ".join(others)


def _default(action: argparse.Action) -> str:
    """The default cell: *required*, blank for no value, the value, or a description where the
    value would depend on the machine generating the page."""
    if action.required:
        return "*required*"
    value = action.default
    if action.nargs == 0 or value is None or value is argparse.SUPPRESS:
        return ""
    if isinstance(value, (list, tuple)):
        value = ",".join(str(item) for item in value)
    text = str(value)
    if _machine_specific(text):
        return "*depends on the machine*"
    return _code(text)


def _machine_specific(text: str) -> bool:
    """Whether a default's text names this machine: an absolute path, the home or working
    folder (a core count cannot be told from a number; the docs test regenerates the page
    with other core counts to catch those)."""
    if os.path.isabs(text) or text.startswith("~"):
        return True
    places = {str(Path.home()), os.getcwd()}
    return any(place in text for place in places if len(place) > 1)


def _code(text: str) -> str:
    """``text`` as a Markdown code span that survives a table cell."""
    if not text:
        return ""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def _markdown(text: str, *, cell: bool = True) -> str:
    """Prose as Markdown: its specials escaped outside `code spans`; in a table ``cell``, '|'
    escaped everywhere too (GitHub ends a cell at a bare '|' even inside a code span)."""
    parts = text.split("`")
    if len(parts) % 2 == 0:  # an unpaired backtick: no code spans at all
        parts = [text]
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"([\\*_\[\]<>])", r"\\\1", parts[i])
    joined = "`".join(parts)
    return joined.replace("|", "\\|") if cell else joined


def exit_codes(docstring: str) -> list[tuple[str, str]]:
    """(code, meaning) pairs from the ``Exit codes: 0 ..., 1 ..., 2 ....`` sentence of the cli
    package's docstring, so that the page says what the code's own documentation says."""
    found = re.search(r"Exit codes:\s*(.+?)\.(?:\s*$|\s*\n\s*\n)", docstring, re.S)
    if not found:
        raise ValueError("the cli package docstring has no 'Exit codes: ...' sentence")
    sentence = " ".join(found.group(1).split())
    pairs = [item.split(" ", 1) for item in re.split(r",\s*(?=\d+\s)", sentence)]
    return [(code, meaning) for code, meaning in pairs]


def collect() -> list[CommandDoc]:
    """One section per command of ``COMMANDS``, in its order."""
    return [
        describe(command_parser(name), help_text, example)
        for name, (help_text, example) in cli.COMMANDS.items()
    ]


def render() -> str:
    """The whole of ``docs/cli.md``."""
    top = cli.build_parser()
    top.formatter_class = _fixed_width(top.formatter_class)
    commands = collect()
    lines = _intro(top)
    lines += ["## Contents", ""]
    lines += _contents(commands, depth=0)
    lines += [""]
    for command in commands:
        lines += _section(command, level=2)
    return "\n".join(lines).rstrip("\n") + "\n"


def _intro(top: argparse.ArgumentParser) -> list[str]:
    lines = [
        "# Command-line reference",
        "",
        f"<!-- Generated from the argument parsers by `{REGENERATE}` (`make docs`). "
        "Do not edit: change the parsers in spindle_dsl/cli/ and regenerate. -->",
        "",
        f"{top.description} Each command is `spindle COMMAND [OPTIONS]`, and `spindle COMMAND "
        "--help` prints the options listed in its section below. This page is generated from "
        f"the parsers themselves (`make docs`, or `{REGENERATE}`), and a test fails when it is "
        "out of date.",
        "",
        "```text",
        top.format_usage().strip(),
        "```",
        "",
    ]
    lines += _table(ArgumentGroup("Options", _rows(top, _top_options(top))))
    lines += ["## Exit codes", "", "| Code | Meaning |", "| --- | --- |"]
    lines += [f"| `{code}` | {_markdown(meaning)} |" for code, meaning in exit_codes(cli.__doc__)]
    return [*lines, ""]


def _top_options(top: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in top._actions if a.option_strings]


def _contents(commands: Sequence[CommandDoc], depth: int) -> list[str]:
    lines = []
    for command in commands:
        link = f"[`{command.prog}`](#{anchor(command.prog)})"
        lines.append(f"{'  ' * depth}- {link}: {_markdown(command.help, cell=False)}")
        lines += _contents(command.children, depth + 1)
    return lines


def _section(command: CommandDoc, level: int) -> list[str]:
    lines = [f"{'#' * level} `{command.prog}`", "", _sentence(command.help), ""]
    if command.description and command.description.strip() != command.help.strip():
        lines += [_markdown(" ".join(command.description.split()), cell=False), ""]
    if command.example:
        lines += ["Example:", "", "```sh", command.example, "```", ""]
    lines += ["```text", command.usage, "```", ""]
    for group in command.groups:
        lines += _table(group)
    for child in command.children:
        lines += _section(child, level + 1)
    return lines


def _sentence(text: str) -> str:
    text = _markdown(text, cell=False)
    return (text[:1].upper() + text[1:]).rstrip(".") + "." if text else ""


def _table(group: ArgumentGroup) -> list[str]:
    if not group.rows:
        return []
    lines = [f"**{_markdown(group.title)}**", ""]
    lines += ["| Argument | Value | Default | Description |", "| --- | --- | --- | --- |"]
    lines += [f"| {r.flags} | {r.value} | {r.default} | {r.help} |" for r in group.rows]
    return [*lines, ""]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spindle_dsl.cli.docs", description="Write the CLI reference (Markdown)."
    )
    parser.add_argument("--out", metavar="FILE", help="write here, atomically (default: stdout)")
    args = parser.parse_args(argv)
    text = render()
    if args.out:
        write_atomic(args.out, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
