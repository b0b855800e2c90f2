"""Every command line the docs show, parsed by the parser of the CLI it invokes.

The shell lines of the fenced code blocks of README.md and docs/*.md that run `bottledwater`,
`bw-stack`, `python -m spark_jobs.<job>` or `spark-submit ... spark_jobs/<job>.py` are parsed with
that CLI's own argparse parser (the worker's `cdc_worker.cli.build_parser`, `stack.cli.build_parser`,
and the parser each Spark job's `main` builds, caught before it parses): nothing runs. A flag the
parser does not know (or only as an abbreviation), a value it refuses, or a missing required option
fails the line, named by page and line number.

Placeholders: `<...>`, `$VARIABLE`, an all-capitals word (`N`, `PREFIX`) and `...` after an option
that takes a value become a value the option accepts; `[--flag VALUE]` is an optional part, shown
bracketed; a `...` in any other place elides further options, so the line is parsed without the
parser's required options, never without its unknown-flag check. Commands written inline in running
text (`bottledwater -d ... slot status`) are parsed the same way, but without required options,
since running text names only what it is about.

Also held against the code: the worker's subcommand table in docs/worker.md lists every subcommand,
action and flag of its parser, and every link or `.md` file a page cites is in the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
import re
import shlex
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from cdc_worker import cli as worker_cli
from cdc_worker.options import OPTIONS
from stack import cli as stack_cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
SHELL_FENCES = frozenset({"", "sh", "bash", "shell", "console"})
SPARK_JOBS = frozenset({"merge", "maintenance", "quality", "verify", "rebuild", "consistent_read"})
PYTHONS = re.compile(r"python(3(\.\d+)?)?")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
CAPITALS = re.compile(r"[A-Z][A-Z0-9_]*(\.\.\.)?")
ELLIPSIS = "..."
SEPARATORS = frozenset({"&&", "||", "|", ";"})


@dataclass(frozen=True)
class DocCommand:
    where: str  # page:line
    line: str  # as the page shows it, continuation lines joined
    cli: str  # "bottledwater", "bw-stack" or "spark_jobs.<job>"
    args: tuple[str, ...]  # after the program (and, for spark-submit, after the job's file)
    inline: bool = False  # a command in running text: its required options are not asked for


# -- finding the command lines ------------------------------------------------------------------


def _lines(page: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line number, text, the fence's language or None outside fences), continuations joined."""
    lines = page.read_text().splitlines()
    fence: str | None = None
    index = 0
    while index < len(lines):
        number, text = index + 1, lines[index].strip()
        index += 1
        if text.startswith("```"):
            fence = text[3:].strip() if fence is None else None
            continue
        while fence is not None and text.endswith("\\") and index < len(lines):
            text = text[:-1] + " " + lines[index].strip()
            index += 1
        yield number, text, fence


def _invocation(tokens: Sequence[str]) -> tuple[str, list[str]] | None:
    """The CLI a simple command runs, and its arguments; None for any other program."""
    rest = list(tokens)
    while rest and (ENV_ASSIGNMENT.match(rest[0]) or rest[0] in ("sudo", "exec", "time")):
        rest.pop(0)
    if not rest:
        return None
    program, args = rest[0].rsplit("/", 1)[-1], rest[1:]
    if program in ("bottledwater", "bw-stack"):
        return program, args
    if PYTHONS.fullmatch(program) and args[:1] == ["-m"] and len(args) > 1:
        module = args[1]
        if module in ("cdc_worker.cli", "stack.cli", "stack"):
            return ("bottledwater" if module == "cdc_worker.cli" else "bw-stack"), args[2:]
        if module.startswith("spark_jobs."):
            return module, args[2:]
        return None
    if program == "spark-submit":
        for position, token in enumerate(args):
            if token.endswith(".py"):
                job = re.search(r"spark_jobs/(\w+)\.py$", token)
                return (f"spark_jobs.{job.group(1)}", args[position + 1 :]) if job else None
    return None


def _commands_in(text: str) -> Iterator[tuple[str, list[str]]]:
    tokens = shlex.split(text, comments=True)
    segment: list[str] = []
    for token in [*tokens, ";"]:
        if token not in SEPARATORS:
            segment.append(token)
            continue
        if segment and segment[0] == "eval":
            for inner in segment[1:]:  # eval "$(bw-stack env)"
                if inner.startswith("$(") and inner.endswith(")"):
                    yield from _commands_in(inner[2:-1])
        else:
            for inner in segment:
                if inner.startswith("$(") and inner.endswith(")"):
                    yield from _commands_in(inner[2:-1])
            found = _invocation(segment)
            if found is not None:
                yield found
        segment = []


def _found(where: str, text: str, inline: bool) -> list[DocCommand]:
    try:
        commands = list(_commands_in(text))
    except ValueError:  # not shell (an output line with a lone quote)
        if re.match(r"(\S*/)?(bottledwater|bw-stack|spark-submit|python\S*)\s", text):
            raise
        return []
    return [DocCommand(where, text, cli, tuple(args), inline) for cli, args in commands]


def doc_commands() -> list[DocCommand]:
    """The command lines of the shell fences, then the commands written inline in running text (a
    program's bare name there is a mention, not a command; `spark_jobs.<job>` stands for any job)."""
    fenced: list[DocCommand] = []
    inline: list[DocCommand] = []
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for number, text, fence in _lines(page):
            where = f"{name}:{number}"
            if fence is None:
                for span in re.findall(r"`([^`]+)`", text):
                    if " " in span.strip():
                        inline += [c for c in _found(where, span, True) if "<" not in c.cli]
            elif fence in SHELL_FENCES:
                fenced += _found(where, text.removeprefix("$ "), False)
    return fenced + inline


# -- the parsers --------------------------------------------------------------------------------


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser built")
        self.parser = parser


def _parser_of_main(main: Callable[[Sequence[str]], object]) -> argparse.ArgumentParser:
    """The parser a job's `main` builds, taken from it when it asks it to parse: nothing of the job
    runs (the logging set-up before it is held back too)."""

    def caught(parser: argparse.ArgumentParser, *_args: object, **_kwargs: object) -> None:
        raise _Built(parser)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", caught),
        mock.patch.object(logging, "basicConfig"),
        mock.patch("spark_jobs.connections.dsn.redact_logs"),
    ):
        try:
            main([])
        except _Built as built:
            return built.parser
    raise AssertionError(f"{main.__module__}.main parsed no command line")


def build_parser(cli: str) -> argparse.ArgumentParser:
    if cli == "bottledwater":
        return worker_cli.build_parser()
    if cli == "bw-stack":
        return stack_cli.build_parser()
    job = cli.removeprefix("spark_jobs.")
    assert job in SPARK_JOBS, f"{cli}: not a Spark job of spark_jobs/ ({', '.join(sorted(SPARK_JOBS))})"
    return _parser_of_main(importlib.import_module(cli).main)


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    found: dict[str, argparse.Action] = {}
    for each in _parsers(parser):
        for flag, action in each._option_string_actions.items():
            found.setdefault(flag, action)
    return found


DUMMIES = ("x", "1", "17", "2026-01-01T00:00:00+00:00")


def _accepted(value: str, convert: object) -> bool:
    try:
        if callable(convert):
            convert(value)
    except Exception:
        return False
    return True


def _dummy(action: argparse.Action) -> str:
    """A value the option accepts in place of a placeholder."""
    for candidate in (*(str(c) for c in action.choices or ()), *DUMMIES):
        if _accepted(candidate, action.type):
            return candidate
    return DUMMIES[0]


def _positional_dummy(parser: argparse.ArgumentParser) -> str:
    """A value every typed positional argument of the CLI accepts (`bw-stack pg up MAJOR`)."""
    types = [a.type for p in _parsers(parser) for a in p._actions if not a.option_strings and a.type]
    return next((c for c in DUMMIES if all(_accepted(c, t) for t in types)), DUMMIES[0])


def _is_placeholder(token: str) -> bool:
    return (
        token == ELLIPSIS
        or ("<" in token and ">" in token)
        or token.startswith("$")
        or bool(CAPITALS.fullmatch(token))
    )


@dataclass(frozen=True)
class Filled:
    argv: list[str]  # the line's arguments, placeholders filled in
    elided: bool  # the line leaves options out (`...`)
    unknown: list[str]  # flags no parser of the CLI declares


def argv_for(command: DocCommand, parser: argparse.ArgumentParser) -> Filled:
    options = _options(parser)
    argv: list[str] = []
    unknown: list[str] = []
    elided = False
    takes_value: argparse.Action | None = None
    for raw in command.args:
        token = raw
        if token == "[options]":
            continue
        if token.startswith("["):  # [--at-lsn N], [MAJOR]
            token = token[1:]
        if token.endswith("]") and "[" not in token:
            token = token[:-1]
        if takes_value is not None:
            argv.append(_dummy(takes_value) if _is_placeholder(token) else token)
            takes_value = None
            continue
        if token == ELLIPSIS:
            elided = True
            continue
        flag, equals, value = token.partition("=")
        action = options.get(flag) if token.startswith("-") else None
        if action is not None and equals:
            argv.append(f"{flag}={_dummy(action) if _is_placeholder(value) else value}")
        elif action is not None:
            argv.append(token)
            takes_value = action if action.nargs != 0 else None
        else:
            if token.startswith("-") and token != "-":
                unknown.append(flag)
            argv.append(_positional_dummy(parser) if _is_placeholder(token) else token)
    return Filled(argv, elided, unknown)


def parse_error(command: DocCommand) -> str | None:
    """None when the CLI's parser takes the line, else what the parser said."""
    parser = build_parser(command.cli)
    for each in _parsers(parser):
        each.allow_abbrev = False  # a documented flag is spelled out
    filled = argv_for(command, parser)
    if filled.elided or command.inline:
        for each in _parsers(parser):
            for action in each._actions:
                action.required = False
    said = io.StringIO()
    try:
        with (
            contextlib.redirect_stderr(said),
            contextlib.redirect_stdout(io.StringIO()),
            mock.patch.object(worker_cli, "print_librdkafka_properties", return_value=True),  # --config-help
        ):
            parser.parse_args(filled.argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            lines = said.getvalue().strip().splitlines()
            said_last = lines[-1] if lines else f"exit {exc.code}"
            return f"unknown flag {', '.join(filled.unknown)} ({said_last})" if filled.unknown else said_last
    return None


# -- the tests ----------------------------------------------------------------------------------

COMMANDS = doc_commands()
FENCED = [c for c in COMMANDS if not c.inline]
INLINE = [c for c in COMMANDS if c.inline]


@pytest.fixture(autouse=True)
def _no_pipeline_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark jobs take their defaults from BOTTLEDWATER_*: the docs' lines stand on their own."""
    for name in list(os.environ):
        if name.startswith(("BOTTLEDWATER_", "BW_")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize("command", FENCED, ids=[c.where for c in FENCED])
def test_the_cli_parses_the_documented_command_line(command: DocCommand) -> None:
    error = parse_error(command)
    assert error is None, f"{command.where}: `{command.line}`: {error}"


@pytest.mark.parametrize("command", INLINE, ids=[f"{c.where} {c.line}" for c in INLINE])
def test_the_cli_takes_the_flags_of_a_command_in_running_text(command: DocCommand) -> None:
    error = parse_error(command)
    assert error is None, f"{command.where}: `{command.line}`: {error}"


def test_every_cli_has_documented_command_lines() -> None:
    """The extraction finds lines of each kind (a change of the docs' markup would otherwise leave
    this test checking nothing)."""
    clis = {c.cli for c in FENCED}
    assert {"bottledwater", "bw-stack", "spark_jobs.merge", "spark_jobs.consistent_read"} <= clis, clis
    assert any(c.line.startswith("spark-submit") for c in FENCED)
    assert len(INLINE) > 20


@pytest.mark.parametrize(
    ("line", "wrong"),
    [
        ("bottledwater -d x --no-such-flag", "--no-such-flag"),
        ("bottledwater -d x --partitons leaf", "--partitons"),  # before a word the parser takes
        ("bottledwater -d ... slot status --confirm x --standbi DSN", "--standbi"),
        (".venv/bin/bw-stack up --spark-clusters", "--spark-clusters"),
        ("python -m spark_jobs.merge -b k:9092 --topic-patern 'x' ...", "--topic-patern"),
        ("spark-submit --master yarn spark_jobs/maintenance.py --warehouse /w --history", "--history"),
        ("bottledwater --output-format xml", "xml"),
        (".venv/bin/python -m spark_jobs.consistent_read public.a", "--warehouse"),
    ],
)
def test_a_wrong_flag_fails_the_line(line: str, wrong: str) -> None:
    (cli, args), *_ = _commands_in(line)
    error = parse_error(DocCommand("test", line, cli, tuple(args)))
    assert error is not None and wrong in error, error


# -- the worker's subcommand table --------------------------------------------------------------


def _subcommand_table() -> list[str]:
    """The first column of the table under "Subcommands" in docs/worker.md."""
    text = (ROOT / "docs" / "worker.md").read_text()
    table = text.split("\nSubcommands", 1)[1].split("\n\n", 2)[1]
    return [row.split("|")[1].strip().strip("`") for row in table.splitlines()[2:]]


def test_the_worker_subcommand_table_lists_every_subcommand_action_and_flag() -> None:
    rows = _subcommand_table()
    shared = {flag for spec in OPTIONS for flag in spec.flags} | {"-h", "--help", "--config-help"}
    parser = worker_cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sub in commands.choices.items():
        mine = [row for row in rows if row.split()[1:3] == ["[options]", name]]
        if not mine:
            missing.append(name)
        for action in sub._actions:
            words = [] if action.option_strings else [str(c) for c in action.choices or ()]
            words += sorted(set(action.option_strings) - shared)
            missing += [
                f"{name} {w}"
                for w in words
                if not any(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", r) for r in mine)
            ]
    assert not missing, f"docs/worker.md's subcommand table lacks: {missing}"


def test_the_worker_subcommand_table_parses() -> None:
    for row in _subcommand_table():
        (cli, args), *_ = _commands_in(row)
        error = parse_error(DocCommand("docs/worker.md subcommand table", row, cli, tuple(args)))
        assert error is None, f"`{row}`: {error}"


# -- what the pages cite ------------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_reaches_a_file_and_heading_of_the_repository() -> None:
    anchors = {
        page: {_anchor(t.lstrip("#")) for _, t, fence in _lines(page) if fence is None and t.startswith("#")}
        for page in PAGES
    }
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists() or (anchor and file in anchors and anchor not in anchors[file]):
                broken.append(f"{page.relative_to(ROOT)}: ({target})")
    assert not broken, broken


def test_no_page_cites_a_file_the_repository_lacks() -> None:
    cited = set()
    for page in PAGES:
        name = page.relative_to(ROOT).as_posix()
        for file in re.findall(r"(?<![\w/.:-])([\w./-]+\.md)\b", page.read_text()):
            if not any(p.exists() for p in (page.parent / file, ROOT / file, ROOT / "docs" / file)):
                cited.add((name, file))
    assert not cited, sorted(cited)
