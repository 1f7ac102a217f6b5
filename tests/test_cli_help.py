"""Every command's `--help` is readable where people read it: at 80 columns (a plain
terminal, a CI log) every option name appears whole, so it can be read and copied, and
no line is wider than the terminal (issue 21, item 5).

The commands come from the click command tree of `python -m infra`
(typer.main.get_command), not from a list: a new command or option is checked too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from infra.cli.app import app

REPO_ROOT = Path(__file__).resolve().parent.parent
WIDTH = 80
PROG = "python -m infra"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def command_tree(command=None, path: tuple[str, ...] = ()):
    """(path, click command) of the root and of every command and subcommand under it."""
    command = command or typer.main.get_command(app)
    yield path, command
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        if not sub.hidden:
            yield from command_tree(sub, (*path, name))


COMMANDS = dict(command_tree())


def option_strings(command) -> list[str]:
    """Every spelling of every visible option: `--x`, `--no-x`, short forms."""
    names = []
    for param in command.params:
        if getattr(param, "param_type_name", "") != "option" or getattr(param, "hidden", False):
            continue
        names += [*param.opts, *param.secondary_opts]
    return names + ["--help"]


def render_help(path: tuple[str, ...]) -> str:
    """`python -m infra <path> --help` in-process in a terminal of WIDTH columns.

    COLUMNS sets the width rich's Console reads; terminal_width the one click's
    plain formatter reads (it otherwise asks shutil, which also reads COLUMNS)."""
    env = {"COLUMNS": str(WIDTH), "LINES": "50", "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None}
    result = CliRunner().invoke(app, [*path, "--help"], env=env, prog_name=PROG, terminal_width=WIDTH)
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.output)


def whole(option: str, text: str) -> bool:
    """The option appears as a word of its own, not cut (`--gpu-memory-utiliz…`) or merged."""
    return re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text) is not None


@pytest.mark.parametrize("path", list(COMMANDS), ids=lambda p: " ".join(p) or "(root)")
def test_every_option_whole_at_80_columns(path):
    text = render_help(path)
    assert text.startswith(f"Usage: {PROG} {' '.join(path)}".rstrip() + " ") or f"Usage: {PROG}" in text, text
    missing = [opt for opt in option_strings(COMMANDS[path]) if not whole(opt, text)]
    assert not missing, f"`{PROG} {' '.join(path)} --help` at {WIDTH} columns cuts or drops {missing}:\n{text}"
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, f"`{PROG} {' '.join(path)} --help` has lines wider than {WIDTH} columns:\n" + "\n".join(wide)


def test_the_tree_has_the_commands():
    """The walk reaches subcommands: a walk that stopped at the root would check nothing."""
    assert {("plan",), ("perf",), ("check",), ("ephemeral",), ("ephemeral", "up"), ("ephemeral", "down")} <= set(COMMANDS)
    assert "--no-expert-parallel" in option_strings(COMMANDS[("plan",)])
    assert "--gpu-memory-utilization" in option_strings(COMMANDS[("plan",)])


def test_whole_refuses_a_cut_name():
    assert whole("--gpu-memory-utilization", "  --gpu-memory-utilization <float>")
    assert not whole("--gpu-memory-utilization", "│ --gpu-memory-utiliz…   <float> │")
    assert not whole("--expert-parallel", "--no-expert-parallel")


def test_the_real_entry_point_at_80_columns():
    """As a user runs it: a subprocess whose terminal is 80 columns wide (COLUMNS)."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")}
    env["COLUMNS"] = str(WIDTH)
    proc = subprocess.run([sys.executable, "-m", "infra", "plan", "--help"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = ANSI.sub("", proc.stdout)
    assert text.startswith("Usage: python -m infra plan "), text
    missing = [opt for opt in option_strings(COMMANDS[("plan",)]) if not whole(opt, text)]
    assert not missing, f"cut or dropped: {missing}\n{text}"
    assert max(map(len, text.splitlines())) <= WIDTH, text
