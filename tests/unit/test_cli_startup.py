"""Cold start of ``flight-serve run`` (DESIGN §11): ``run`` / ``explain`` start with the cyclic
garbage collector off (``cli._startup_gc``), and ``main`` builds the options of the one
sub-command it runs (``cli.build_parser(only)``)."""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
from collections.abc import Callable, Iterator

import pytest
from flight_serve import cli


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    if was:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_collector_off_while_starting_then_frozen_then_restored() -> None:
    with cli._startup_gc() as started:
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
        started()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
        started()  # a second call changes nothing
        assert gc.isenabled()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_on")
def test_collector_restored_when_the_start_fails() -> None:
    def start() -> None:
        with cli._startup_gc():
            assert not gc.isenabled()
            raise RuntimeError("bad pipeline")

    with pytest.raises(RuntimeError):
        start()
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


@pytest.mark.usefixtures("collector_on")
def test_a_collector_the_caller_turned_off_or_froze_is_left_alone() -> None:
    gc.disable()
    with cli._startup_gc() as started:
        started()
        assert not gc.isenabled()
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()
    gc.enable()
    gc.freeze()
    with cli._startup_gc() as started:
        assert gc.isenabled()
        started()
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0  # still frozen: not unfrozen on the way out


def _parsed(
    parser: argparse.ArgumentParser | Callable[[list[str]], argparse.Namespace], argv: list[str]
) -> tuple[str, str, str]:
    if isinstance(parser, argparse.ArgumentParser):
        full = parser

        def parse(argv: list[str]) -> argparse.Namespace:
            return cli.parse_with(full, argv)

    else:
        parse = parser
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = repr(sorted(vars(parse(argv)).items()))
        except SystemExit as exc:
            result = f"exit {exc.code}"
    return result, out.getvalue(), err.getvalue()


_ARGVS = [
    ["run", "p.sql"],
    ["run", "p.sql", "--checkpoint-every", "3", "--fresh", "--output-dir", "out"],
    ["run", "--help"],
    ["run"],
    ["run", "p.sql", "--bogus"],
    ["explain", "p.sql"],
    ["serve", "--port", "0", "--memory-budget", "1GiB"],
    ["serve", "--help"],
    ["pipelines", "logs", "abc", "-f"],
    ["pipelines", "update", "--help"],
    ["streams", "put", "s", "f.csv"],
    ["streams", "tail", "--help"],
    ["query", "SELECT 1"],
    ["data", "nycflights13", "--out", "x.parquet"],
    ["submit", "p.sql", "--name", "n"],
    ["bogus"],
]


@pytest.mark.parametrize("argv", _ARGVS)
def test_the_parser_of_one_command_parses_as_the_full_parser(argv: list[str]) -> None:
    assert cli._command_of(argv) == argv[0]
    assert _parsed(cli.build_parser(argv[0]), argv) == _parsed(cli.build_parser(), argv)


@pytest.mark.parametrize(
    "argv",
    [
        *_ARGVS,
        ["run", "p.sql", "--parallelism", "x"],
        ["run", "p.sql", "--version"],
        ["run", "p.sql", "--resume", "--fresh"],
        ["rnu", "p.sql"],
        ["explain"],
        ["data", "bogus", "--out", "x"],
        ["pipelines", "list", "--user", "u", "--json"],
        ["--version"],
        ["--help"],
        [],
    ],
)
def test_main_parses_as_the_full_parser(argv: list[str]) -> None:
    """main's lean parse (one sub-command built, not even the others listed) gives the full
    parser's namespace, and on any error or help its exact output and exit code."""
    assert _parsed(cli.parse_args, argv) == _parsed(cli.build_parser(), argv)


def test_a_lean_parser_builds_one_sub_command_and_refuses_errors() -> None:
    parser = cli.build_parser("run", lean=True)
    assert vars(parser.parse_args(["run", "p.sql"]))["command"] == "run"
    with pytest.raises(cli._Unparsed):
        parser.parse_args(["explain", "p.sql"])  # not built: an error, not a listed command


def test_help_and_version_get_the_full_parser() -> None:
    assert cli._command_of(["--help"]) is None
    assert cli._command_of(["--version"]) is None
    assert cli._command_of([]) is None
