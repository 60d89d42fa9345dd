"""``python -m fxviews``: the demo end to end, ``--help`` on every command, argument errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fxviews import cli


def test_demo_end_to_end_in_a_subprocess():
    env = dict(os.environ)
    env.pop("FXVIEWS_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "fxviews", "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "as_strided(clone_1, [6], [1], 0)" in out
    assert "<- wrong numbers" in out
    assert "provenance" in out and "+++ after" in out
    assert "vmap(rewritten graph, in_dims=(1, 2, 2)): largest error 0" in out
    assert "both match the per-sample reference" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_demo_in_process_with_options(capsys):
    assert cli.main(["demo", "--batch-size", "2", "--seed", "3", "--width", "80"]) == 0
    out = capsys.readouterr().out
    assert "over a batch of 2" in out
    table = out[out.index("node  ") : out.index("fxviews: as_strided")]
    assert max(len(line) for line in table.splitlines()) <= 80


@pytest.mark.parametrize("argv", [["--help"], ["demo", "--help"], ["bench", "--help"]])
def test_help_on_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: fxviews")


def test_every_registered_command_is_listed_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in ("demo", "bench"):
        assert command in out


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nope"],
        ["demo", "--batch-size", "many"],
        ["demo", "--batch-size", "0"],
        ["demo", "--width", "20"],
        ["bench", "--threads", "0"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    assert "usage: fxviews" in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("fxviews ")
