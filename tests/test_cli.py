"""The command line as a user meets it: help, version, one-line errors with exit status 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

from crackseg.cli import build_parser

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "crackseg", *args], capture_output=True, text=True, timeout=120)


def test_version():
    result = _run("--version")
    assert result.returncode == 0 and result.stdout.startswith("crackseg ")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_defaults(command):
    result = _run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: crackseg " + command in result.stdout
    assert "default" in result.stdout


@pytest.mark.parametrize(
    "args, named",
    [
        (["synth", "OUT", "--count", "0"], "--count"),
        (["synth", "OUT", "--size", "abc"], "--size"),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_bad_values_exit_2_with_one_line(args, named):
    result = _run(*args)
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("crackseg") and "error:" in last and named in last
    assert "Traceback" not in result.stderr


def test_input_error_is_one_line_naming_the_path(tmp_path):
    assert _run("synth", str(tmp_path), "--count", "1", "--size", "32").returncode == 0
    result = _run("synth", str(tmp_path), "--count", "1", "--size", "32")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("crackseg: error: ") and str(tmp_path) in result.stderr
