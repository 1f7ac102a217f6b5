"""The commands the docs show are the CLI's, and the offline ones run (issue 21, item 4).

Every fenced ```sh block of README.md and docs/**/*.md is read:

- A block whose first line is `# needs: WORDS` (WORDS from aws, pulumi, cluster, docker)
  needs a cloud account, the Pulumi CLI, a running cluster or Docker: it is not run. A block
  whose first line is `# not run: REASON` is not run either (e.g. `bin/test`, which is the
  test suite itself).
- A block followed, blank lines aside, by an HTML comment `<!-- generated: ... -->` has its
  output written into the docs by `python -m infra docs` and checked by tests/test_docs.py:
  it is not run here.
- In every block, run or not, each command (a line, `\\` continuations joined, a trailing
  `# comment` stripped, `KEY=value` prefixes and pipes understood) that invokes
  `python -m infra CMD [SUBCMD] ...`, or `bin/plan ARGS` (which runs
  `python -m infra plan --stack ${STACK:-prod} ARGS`), is parsed against the CLI's click
  command tree: the command must exist and each flag must be an option its `--help` shows
  (whole, at 80 columns: tests/test_cli_help.py).
  A synopsis may use `[` `]` around optional parts, `|` between alternatives, `...` and
  placeholder values in capitals (NAME_OR_PATH, FILE, N).
- Every other block is run: its `python -m infra` commands, in order, in-process and
  offline (no network, no AWS credentials, no Pulumi CLI on PATH, no kubeconfig), in a
  scratch directory that holds the repository's files (what a command writes stays out of
  the working tree; a file a command reads must be in the repository or written by an
  earlier command of the same block). Optional `[...]` parts are left out when run; a line
  still holding a placeholder is a synopsis, parsed only. A command must exit 0, or the
  status its trailing comment starts with: `# exit 1: ...` (a finding: an infeasible plan,
  a failed check). Then its output's key facts are checked against the code: for `plan`,
  the layout, `--max-num-seqs` and SLA capacity of the plan infra.planning makes for the
  same arguments; for `check`, every rule of the policy pack passed; for `perf`, one row per
  requested concurrency or rate; for `synth`, the document of the stack; for `diff`, the
  two stacks and the counts of resources added and deleted; for `--help`, the usage line.
  An unmarked block may not use aws, pulumi, kubectl, helm, docker or curl (mark it), and
  lines of other programs are not run.
- bare `bin/plan` (set-up, then plan, synth and check) is not run; `scan` (checkov,
  minutes), `perf --validate` (~10 s) and `perf --fit` (~2 min), `perf --compare-aiconfigurator` (installs
  venv-perf/) and `docs` (rewrites the docs) are parsed only: PARSED_ONLY says where each is
  tested instead.

A failure names the file and line, and the unknown command or flag, the exit status or the
fact that changed. Each distinct command is run once per session (in the same scratch
state). The functions take the Markdown root as a parameter, so the tests of this test at
the end point them at a scratch copy.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import shlex
import socket
import tempfile
import traceback
from contextlib import chdir, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional
from unittest import mock

import pytest
import typer.main
from typer.testing import CliRunner

from infra.cli.app import app
from tests.test_cli_help import WIDTH as HELP_WIDTH
from tests.test_cli_help import render_help, whole

REPO_ROOT = Path(__file__).resolve().parent.parent
PROG = "python -m infra"
NEEDS = ("aws", "pulumi", "cluster", "docker")
# Programs an unmarked block may not use, and the `# needs:` word each calls for.
PROGRAM_NEEDS = {
    "aws": ("aws", "an AWS account"),
    "pulumi": ("pulumi", "the Pulumi CLI"),
    "kubectl": ("cluster", "a running cluster"),
    "helm": ("cluster", "a running cluster"),
    "curl": ("", "the network (an endpoint)"),
    "docker": ("docker", "Docker"),
}
PYTHONS = ("python", "python3", "venv/bin/python", "./venv/bin/python")
BIN_PLAN = ("bin/plan", "./bin/plan")
# Commands parsed but never run here, by command path (and flag), with where they are tested.
PARSED_ONLY = {
    ("scan",): "runs checkov over the synthesis (minutes): tests/test_scan.py scans prod with the pinned checkov",
    ("perf", "--validate"): "predicts every published measurement (~10 s): tests/test_perf_validation.py predicts the same rows",
    ("perf", "--fit"): "re-fits the performance model (slow): tests/test_perf_validation.py",
    ("perf", "--compare-aiconfigurator"): "installs venv-perf/ from the network on first use: tests/test_aiconfigurator.py",
    ("docs",): "rewrites the docs themselves: tests/test_docs.py runs the generator",
}
WIDTH = 1000  # columns the commands run at: no table cell wraps a fact across lines
PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*(?:\.[A-Z_]+)*")  # NAME_OR_PATH, N, FILE, X.Y.Z (a GPU's H100-SXM-80GB is a value)
NUMBER = re.compile(r"-\d")
SHELL = re.compile(r"[$`~<>*]")  # substitutions, redirections, globs: a shell's, not ours
SEPARATORS = ("|", "||", "&&", ";")


# --------------------------------------------------------------------------- reading the docs


@dataclass(frozen=True)
class Block:
    file: str  # relative to the Markdown root
    line: int  # of the opening fence
    lines: tuple[tuple[int, str], ...]  # (line number, text) of the body
    kind: str  # "run", "needs", "not run" or "generated"
    detail: str = ""  # the needs words, or the reason it is not run

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def markdown_files(root: Path) -> list[Path]:
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    return files + (sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else [])


def read_blocks(root: Path) -> list[Block]:
    """Every ```sh block under ROOT, with what its first line and the line after it say."""
    blocks = []
    for path in markdown_files(root):
        text = path.read_text().splitlines()
        i = 0
        while i < len(text):
            if text[i].strip() != "```sh":
                i += 1
                continue
            start, body = i + 1, []
            i += 1
            while i < len(text) and text[i].strip() != "```":
                body.append((i + 1, text[i]))
                i += 1
            after = i + 1
            while after < len(text) and not text[after].strip():
                after += 1
            first = body[0][1].strip() if body else ""
            if after < len(text) and text[after].lstrip().startswith("<!-- generated:"):
                kind, detail = "generated", text[after].strip()
            elif m := re.match(r"#\s*needs:\s*(.*)$", first):
                kind, detail = "needs", m[1].strip()
            elif m := re.match(r"#\s*not run:\s*(.*)$", first):
                kind, detail = "not run", m[1].strip()
            else:
                kind, detail = "run", ""
            blocks.append(Block(path.relative_to(root).as_posix(), start, tuple(body), kind, detail))
            i += 1
    return blocks


def split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of a shell line: a `#` at a word's start, outside quotes, starts the comment."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i:]
    return line.rstrip(), ""


def logical_lines(block: Block) -> Iterator[tuple[int, str, str]]:
    """(first line number, code, comment) of each command line: `\\` continuations joined;
    comment lines (which a trailing backslash does not continue) skipped."""
    pending: Optional[tuple[int, str]] = None
    for number, raw in block.lines:
        if pending is None and raw.lstrip().startswith("#"):
            continue
        code, comment = split_comment(raw)
        if code.endswith("\\") and not comment:
            pending = (pending[0], pending[1] + " " + code[:-1]) if pending else (number, code[:-1])
            continue
        if pending:
            number, code = pending[0], pending[1] + " " + code
            pending = None
        if code.strip():
            yield number, code.strip(), comment
    if pending:
        yield pending[0], pending[1].strip(), ""


# --------------------------------------------------------------------------- the commands in a block


@dataclass(frozen=True)
class Command:
    """One invocation of the CLI in a block."""

    where: str  # file:line
    text: str  # as the doc writes it (a logical line)
    argv: tuple[str, ...]  # after `python -m infra`, as written (brackets and placeholders kept)
    env: tuple[tuple[str, str], ...] = ()
    expect: int = 0
    stdin_from: Optional["Command"] = None  # an earlier command of the line piped into this one
    via_bin_plan: bool = False
    runnable: bool = True  # False: bare bin/plan

    @property
    def shown(self) -> str:
        return f"bin/plan {' '.join(self.argv[1:])}".strip() if self.via_bin_plan else f"{PROG} {' '.join(self.argv)}"


@dataclass
class Parsed:
    commands: list[Command] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    programs: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)  # (where, program, text) not ours


def _segments(tokens: list[str]) -> list[tuple[list[str], str]]:
    """The simple commands of a tokenised line, each with the separator before it ('' first).
    A `|` inside `[...]` separates alternatives of a synopsis, not commands."""
    out: list[tuple[list[str], str]] = [([], "")]
    depth = 0
    for tok in tokens:
        if tok in SEPARATORS and depth == 0:
            out.append(([], tok))
            continue
        out[-1][0].append(tok)
        depth += len(tok) - len(tok.lstrip("[")) - (len(tok) - len(tok.rstrip("]")))
        depth = max(depth, 0)
    return [(seg, sep) for seg, sep in out if seg]


def parse_block(block: Block) -> Parsed:
    parsed = Parsed()
    for number, code, comment in logical_lines(block):
        where = f"{block.file}:{number}"
        try:
            tokens = shlex.split(code, posix=True)
        except ValueError as err:
            if "infra" in code or "bin/plan" in code:
                parsed.problems.append(f"{where}: cannot split `{code}` as a shell line: {err}")
            continue
        m = re.match(r"#\s*exit\s+(\d+)\b", comment)
        expect = int(m[1]) if m else 0
        previous: Optional[Command] = None
        previous_program = ""
        for seg, sep in _segments(tokens):
            env = []
            while seg and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", seg[0]):
                key, _, value = seg.pop(0).partition("=")
                env.append((key, value))
            for sub in re.findall(r"\$\(\s*([^\s)]+)", " ".join(seg)):
                parsed.programs.append((where, sub, code))
            if not seg:
                continue
            program = seg[0]
            cmd: Optional[Command] = None
            if program in PYTHONS and seg[1:3] == ["-m", "infra"]:
                cmd = Command(where, code, tuple(seg[3:]), tuple(env), expect)
            elif program in BIN_PLAN:
                cmd = Command(where, code, ("plan", *seg[1:]), tuple(env), expect, via_bin_plan=True, runnable=len(seg) > 1)
            else:
                parsed.programs.append((where, program, code))
            if cmd is not None:
                if sep == "|":
                    if previous is not None:
                        cmd = dataclasses.replace(cmd, stdin_from=previous)
                    else:
                        cmd = dataclasses.replace(cmd, stdin_from=Command(where, code, ("<" + previous_program + ">",), runnable=False))
                parsed.commands.append(cmd)
            previous, previous_program = cmd, program
    return parsed


# --------------------------------------------------------------------------- flags against the click tree


ROOT_COMMAND = typer.main.get_command(app)


def _bare(tok: str) -> str:
    return tok.lstrip("[(").rstrip("])")


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and tok != "-" and not NUMBER.match(tok)


def options_of(command) -> dict[str, object]:
    """Every option spelling `--help` shows for a click command: `--x`, `--no-x`, short forms, `--help`."""
    out: dict[str, object] = {}
    for p in command.params:
        if p.param_type_name == "option" and not p.hidden:
            for name in (*p.opts, *p.secondary_opts):
                out[name] = p
    for name in command.get_help_option_names(command.context_class(command, info_name=command.name)):
        out[name] = None
    return out


def resolve(argv: tuple[str, ...]) -> tuple[tuple[str, ...], object, list[str], Optional[str]]:
    """(command path, click command, the rest of argv, a problem) for `python -m infra ARGV`."""
    command, path, rest = ROOT_COMMAND, [], list(argv)
    while getattr(command, "commands", None) is not None and rest:
        name = _bare(rest[0])
        if _is_flag(name):
            break
        sub = command.commands.get(name)
        if sub is None or sub.hidden:
            known = ", ".join(n for n, c in sorted(command.commands.items()) if not c.hidden)
            return tuple(path), command, rest, f"`{' '.join([PROG, *path])}` has no command {name!r} (it has {known})"
        command, path, rest = sub, [*path, name], rest[1:]
    return tuple(path), command, rest, None


@functools.cache
def help_text(path: tuple[str, ...]) -> str:
    return render_help(path)


def flag_problems(cmd: Command) -> list[str]:
    """An unknown command, an option the command does not have or does not show, an option without its value."""
    path, command, rest, problem = resolve(cmd.argv)
    if problem:
        return [f"{cmd.where}: `{cmd.shown}`: {problem}"]
    options, problems = options_of(command), []
    hidden = {n for p in command.params if getattr(p, "hidden", False) for n in (*p.opts, *p.secondary_opts)}
    i = 0
    while i < len(rest):
        tok = _bare(rest[i])
        i += 1
        if not _is_flag(tok):
            continue
        name = tok.split("=", 1)[0]
        label = " ".join([PROG, *path])
        if name not in options:
            why = "a hidden option, not in its --help" if name in hidden else "no such option"
            problems.append(f"{cmd.where}: `{cmd.shown}`: unknown flag {name} for `{label}` ({why}; "
                            f"it has {', '.join(sorted(options))})")  # fmt: skip
            continue
        if not whole(name, help_text(path)):
            problems.append(f"{cmd.where}: `{cmd.shown}`: {name} is not whole in `{label} --help` at {HELP_WIDTH} columns")
        param = options[name]
        takes_value = param is not None and not getattr(param, "is_flag", False) and not getattr(param, "count", False)
        if takes_value and "=" not in tok:
            nxt = _bare(rest[i]) if i < len(rest) else ""
            if not nxt or _is_flag(nxt) or nxt == "|" or rest[i - 1].endswith("]"):
                problems.append(f"{cmd.where}: `{cmd.shown}`: {name} of `{label}` takes a value, and none follows")
            else:
                i += 1
    return problems


def block_flag_problems(block: Block) -> list[str]:
    parsed = parse_block(block)
    problems = list(parsed.problems)
    if block.kind == "needs":
        words = [w for w in re.split(r"[,\s]+", block.detail) if w]
        wrong = [w for w in words if w not in NEEDS]
        if not words or wrong:
            problems.append(f"{block}: `# needs: {block.detail}`: the words are from {', '.join(NEEDS)}")
    if block.kind == "not run" and not block.detail:
        problems.append(f"{block}: `# not run:` gives no reason")
    for cmd in parsed.commands:
        problems += flag_problems(cmd)
    return problems


# --------------------------------------------------------------------------- running a block


@dataclass(frozen=True)
class Run:
    status: int
    stdout: str
    output: str  # stdout and stderr
    files: tuple[tuple[str, bytes], ...]  # what the scratch directory held afterwards (its own files)
    error: str = ""  # a traceback, when the command raised


def _optional_parts_left_out(argv: tuple[str, ...]) -> list[str]:
    out, depth = [], 0
    for tok in argv:
        opening = len(tok) - len(tok.lstrip("["))
        closing = len(tok) - len(tok.rstrip("]"))
        if depth == 0 and opening == 0:
            out.append(tok)
        depth = max(depth + opening - closing, 0)
    return out


def run_argv(cmd: Command) -> tuple[Optional[list[str]], str]:
    """What to run for CMD, or (None, why it is only parsed)."""
    if not cmd.runnable:
        return None, "bare bin/plan sets up ./venv and runs plan, synth and check, each tested where the docs show it"
    argv = _optional_parts_left_out(cmd.argv)
    if cmd.via_bin_plan:
        argv = ["plan", "--stack", dict(cmd.env).get("STACK", "prod"), *argv[1:]]
    path, _, rest, _ = resolve(tuple(argv))
    for key, why in PARSED_ONLY.items():
        if path == tuple(k for k in key if not k.startswith("-")) and all(f in rest for f in key if f.startswith("-")):
            return None, why
    for tok in argv:
        if tok in ("...", "|") or PLACEHOLDER.fullmatch(tok) or SHELL.search(tok):
            return None, f"a synopsis ({tok!r} is a placeholder or the shell's)"
    return argv, ""


def _own_files(directory: Path) -> dict[str, bytes]:
    """Regular files under DIRECTORY, not through its symbolic links to the repository."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                out[os.path.relpath(p, directory)] = Path(p).read_bytes()
    return out


def _skipped(name: str) -> bool:
    """Directories the mirror leaves out: git's, virtualenvs, caches."""
    return name.startswith(("venv", "__pycache__")) or (name.startswith(".") and name not in (".ci", ".github"))


def scratch_directory(tmp: Path, files: dict[str, bytes]) -> Path:
    """A directory with the repository's directories (real ones, so a command's output stays here)
    and its files (symbolic links), and FILES (written by earlier commands of the block)."""
    d = Path(tempfile.mkdtemp(prefix="block-", dir=tmp))
    for dirpath, dirnames, filenames in os.walk(REPO_ROOT):
        dirnames[:] = [n for n in dirnames if not _skipped(n)]
        here = d / os.path.relpath(dirpath, REPO_ROOT)
        here.mkdir(exist_ok=True)
        for name in filenames:
            (here / name).symlink_to(os.path.join(dirpath, name))
    for rel, data in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


@contextmanager
def offline() -> Iterator[None]:
    """No connection but to the loopback while a command runs in-process."""
    real_connect, real_getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def connect(sock, address):
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network call refused by tests/test_docs_commands.py: {address!r}")
        return real_connect(sock, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in (None, "localhost", "127.0.0.1", "::1"):
            raise OSError(f"network lookup refused by tests/test_docs_commands.py: {host!r}")
        return real_getaddrinfo(host, *args, **kwargs)

    with mock.patch.object(socket.socket, "connect", connect), mock.patch.object(socket, "getaddrinfo", getaddrinfo):
        yield


def offline_env(tmp: Path, doc_env: dict[str, str]) -> dict[str, Optional[str]]:
    nothing = str(tmp / "nonexistent")
    (tmp / "empty-bin").mkdir(exist_ok=True)
    env: dict[str, Optional[str]] = {k: None for k in os.environ if k.startswith(("AWS_", "PULUMI_", "GITHUB_"))}
    env.update({
        "COLUMNS": str(WIDTH), "LINES": "100", "NO_COLOR": "1", "TERM": "dumb",
        "FORCE_COLOR": None, "TTY_COMPATIBLE": None, "TTY_INTERACTIVE": None,
        "AWS_CONFIG_FILE": nothing, "AWS_SHARED_CREDENTIALS_FILE": nothing, "AWS_EC2_METADATA_DISABLED": "true",
        "KUBECONFIG": nothing, "PULUMI_HOME": nothing, "PATH": str(tmp / "empty-bin"),
    })  # fmt: skip
    env.update(doc_env)
    return env


class Runner:
    """Runs the commands of blocks; each distinct command, in the same scratch state, once."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.cache: dict[tuple, Run] = {}

    def run(self, argv: list[str], env: dict[str, str], stdin: Optional[str], files: dict[str, bytes]) -> Run:
        state = hashlib.sha256(repr(sorted(files.items())).encode()).hexdigest()
        key = (tuple(argv), tuple(sorted(env.items())), stdin, state)
        if key not in self.cache:
            directory = scratch_directory(self.tmp, files)
            with chdir(directory), offline():
                result = CliRunner().invoke(app, argv, input=stdin, env=offline_env(self.tmp, env), prog_name=PROG)
            error = ""
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                error = "".join(traceback.format_exception(result.exception))
            self.cache[key] = Run(result.exit_code, result.stdout, result.output, tuple(sorted(_own_files(directory).items())), error)
        return self.cache[key]


def block_run_problems(block: Block, runner: Runner) -> list[str]:
    """Run an unmarked block's commands in order; what went wrong, or what changed."""
    parsed = parse_block(block)
    problems = []
    for where, program, text in parsed.programs:
        if program in PROGRAM_NEEDS:
            word, what = PROGRAM_NEEDS[program]
            problems.append(f"{where}: `{text}`: {program} needs {what}, which the test does not have: "
                            f"mark the block (first line `# needs: {word or '...'}`) or move the line to a marked block")  # fmt: skip
    files: dict[str, bytes] = {}
    outputs: dict[int, Run] = {}
    for cmd in parsed.commands:
        if cmd.stdin_from is not None and cmd.stdin_from.argv[0].startswith("<"):
            problems.append(f"{cmd.where}: `{cmd.text}`: reads {cmd.stdin_from.argv[0][1:-1]}'s output through a pipe, "
                            "which the test cannot run: mark the block `# needs: ...`")  # fmt: skip
            continue
        argv, why = run_argv(cmd)
        if argv is None:
            continue
        stdin = None
        if cmd.stdin_from is not None:
            producer = outputs.get(id(cmd.stdin_from))
            if producer is None:
                continue  # the producer is not run (a synopsis): neither is this
            stdin = producer.stdout
        run = runner.run(argv, dict(cmd.env), stdin, files)
        outputs[id(cmd)] = run
        files = dict(run.files)
        shown = f"{PROG} {' '.join(argv)}"
        if run.error:
            problems.append(f"{cmd.where}: `{shown}` raised:\n{run.error}")
            continue
        if run.status != cmd.expect:
            problems.append(
                f"{cmd.where}: `{shown}` exited {run.status}, the doc expects {cmd.expect} "
                f"(a status other than 0 is written as a trailing `# exit N` comment; a command that needs an "
                f"account, the Pulumi CLI, a cluster or Docker belongs in a block marked `# needs: ...`):\n"
                f"{run.output.strip()[-1500:]}"
            )  # fmt: skip
            continue
        problems += [f"{cmd.where}: `{shown}`: {p}" for p in fact_problems(argv, run, files)]
    return problems


# --------------------------------------------------------------------------- the facts of an output


def _params(argv: list[str]):
    path, command, rest, _ = resolve(tuple(argv))
    ctx = command.make_context(" ".join([PROG, *path]), list(rest), resilient_parsing=True)
    return path, ctx.params


def fact_problems(argv: list[str], run: Run, files: dict[str, bytes]) -> list[str]:
    """The key facts of a command's output, computed here from the code, that the output does not show."""
    path, params = _params(argv)
    if "--help" in argv:
        usage = f"Usage: {' '.join([PROG, *path])}"
        return [] if usage in run.stdout else [f"the help has no `{usage}` line"]
    check = {("plan",): _plan_facts, ("check",): _check_facts, ("perf",): _perf_facts,
             ("synth",): _synth_facts, ("diff",): _diff_facts}.get(path)  # fmt: skip
    return check(params, run, files) if check else []


def _plan_facts(params: dict, run: Run, files: dict[str, bytes]) -> list[str]:
    from infra.config import load_stack_file
    from infra.planning import PlanRequest, make_plan

    if params["stack"]:
        req = load_stack_file(params["stack"], params.get("root")).plan_request()
    else:
        req = PlanRequest(model=params["model"], instance_type=params["instance_type"], nodes=params["nodes"])
    fields = {f.name for f in dataclasses.fields(PlanRequest)}
    req = req.replace(**{k: v for k, v in params.items() if k in fields and v is not None})
    data = make_plan(req).to_json_dict()
    lay, vllm, perf = data["layout"], data["vllm"], data.get("performance") or {}
    cap = perf.get("sla_capacity") or {}
    problems = []
    if run.status != (0 if data["feasible"] else 1):
        problems.append(f"exit {run.status}, while the plan is {'feasible' if data['feasible'] else 'infeasible'}")
    if params["as_json"]:
        got = json.loads(run.stdout)
        for key, want, have in (("layout", lay, got.get("layout")), ("vllm.max_num_seqs", vllm["max_num_seqs"], got.get("vllm", {}).get("max_num_seqs")),
                                ("performance.sla_capacity", cap or None, (got.get("performance") or {}).get("sla_capacity"))):  # fmt: skip
            if want != have:
                problems.append(f"{key} is {have!r}, the plan's (infra.planning) is {want!r}")
        return problems
    facts = [(f"TP {lay['tp']} x PP {lay['pp']} x DP {lay['dp']}", "the plan's layout"),
             (f"--max-num-seqs {vllm['max_num_seqs']}", "the plan's --max-num-seqs")]  # fmt: skip
    if cap.get("concurrency"):
        facts.append((f"{cap['concurrency']:,} concurrent requests", "the plan's SLA capacity"))
    for fact, what in facts:
        if not re.search(rf"(?<![\w-]){re.escape(fact)}(?!\w|[.,]\d)", run.stdout):
            problems.append(f"the output does not show `{fact}` ({what}, from infra.planning)")
    return problems


def _check_facts(params: dict, run: Run, files: dict[str, bytes]) -> list[str]:
    from policies.rules import RULES

    if params["as_json"]:
        got = json.loads(run.stdout)
        ok = len(got["rules"]) == len(RULES) and got["passed"] == (run.status == 0)
        return [] if ok else [f"{len(got['rules'])} rules, passed {got['passed']}; the policy pack has {len(RULES)} rules"]
    if run.status == 0:
        fact = f"All {len(RULES)} policy rules passed: stack {params['stack']}"
        return [] if fact in run.stdout else [f"the output does not say `{fact}` (the policy pack has {len(RULES)} rules)"]
    return []


def _perf_facts(params: dict, run: Run, files: dict[str, bytes]) -> list[str]:
    if params.get("concurrency"):
        want = [f"C={int(c)}" for c in params["concurrency"].split(",")]
    elif params.get("request_rate"):
        want = [f"{float(r):g} req/s" for r in params["request_rate"].split(",")]
    else:
        return []
    if params["as_json"]:
        points = json.loads(run.stdout)["points"]
        have = [f"C={p['concurrency']}" if p["concurrency"] else f"{p['request_rate']:g} req/s" for p in points]
    else:
        have = re.findall(r"^\S (C=\d+|[\d.]+ req/s) ", run.stdout, re.M)
    return [] if have == want else [f"rows {have}, one per requested load is {want}"]


def _synth_facts(params: dict, run: Run, files: dict[str, bytes]) -> list[str]:
    out = params.get("out")
    if out is not None and str(out) not in files:
        return [f"wrote no {out}"]
    doc = json.loads(files[str(out)] if out is not None else run.stdout)
    if doc.get("stack") != params["stack"] or not doc.get("resources"):
        return [f"the document is of stack {doc.get('stack')!r} with {len(doc.get('resources') or [])} resources"]
    return []


def _diff_facts(params: dict, run: Run, files: dict[str, bytes]) -> list[str]:
    def load(name) -> dict:
        return json.loads(files[str(name)] if str(name) in files else (REPO_ROOT / str(name)).read_bytes())

    base, head = load(params["base"]), load(params["head"])
    problems = []
    title = f"`{base['project']}/{base['stack']} → {head['project']}/{head['stack']}`"
    if title not in run.stdout:
        problems.append(f"the output does not name {title}")
    m = re.search(r"\*\*(\d+) to add, (\d+) to change, (\d+) to delete\*\*", run.stdout)
    old, new = {r["urn"] for r in base["resources"]}, {r["urn"] for r in head["resources"]}
    moved = any((r.get("options") or {}).get("aliases") for r in head["resources"])
    if not m:
        problems.append("the output has no `N to add, N to change, N to delete` line")
    elif moved and not (int(m[1]) <= len(new - old) and int(m[3]) <= len(old - new)):
        problems.append(f"{m[0]}, but only {len(new - old)} URNs are new and {len(old - new)} gone")
    elif not moved and (int(m[1]), int(m[3])) != (len(new - old), len(old - new)):
        problems.append(f"{m[0]}, but {len(new - old)} URNs are new and {len(old - new)} gone")
    return problems


# --------------------------------------------------------------------------- the tests

BLOCKS = read_blocks(REPO_ROOT)
# Blocks of today's docs this test finds wrong, until the docs are fixed: (test, file, text of a line of
# the block): why. An entry fails (strict xfail) once the doc is right: then delete it.
KNOWN: dict[tuple[str, str, str], str] = {}


def _known(test: str, block: Block):
    for (kind, file, line), why in KNOWN.items():
        if kind == test and block.file == file and any(line in text for _, text in block.lines):
            return [pytest.mark.xfail(reason=why, strict=True)]
    return []


@pytest.fixture(scope="session")
def runner(tmp_path_factory) -> Runner:
    return Runner(tmp_path_factory.mktemp("docs-commands"))


def test_the_docs_have_sh_blocks():
    assert BLOCKS, "no ```sh block in README.md or docs/"


@pytest.mark.parametrize("block", [pytest.param(b, id=str(b), marks=_known("flags", b)) for b in BLOCKS])
def test_flags(block):
    problems = block_flag_problems(block)
    assert not problems, "\n".join(problems)


RUN_BLOCKS = [b for b in BLOCKS if b.kind == "run"]


@pytest.mark.parametrize("block", [pytest.param(b, id=str(b), marks=_known("runs", b)) for b in RUN_BLOCKS])
def test_runs(block, runner):
    problems = block_run_problems(block, runner)
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- tests of this test


def _docs(tmp_path: Path, readme: str) -> list[Block]:
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "README.md").write_text(readme)
    return read_blocks(tmp_path)


def test_an_unknown_flag_is_named_with_its_file_and_line(tmp_path):
    blocks = _docs(tmp_path, "# t\n\n```sh\npython -m infra plan --stack prod \\\n    [--json] [--no-such-flag]   # a comment\n```\n")
    (problems,) = [block_flag_problems(b) for b in blocks]
    assert len(problems) == 1 and problems[0].startswith("README.md:4: ") and "unknown flag --no-such-flag for `python -m infra plan`" in problems[0], problems


def test_flags_are_checked_in_every_kind_of_block(tmp_path):
    text = ("```sh\n# needs: aws, pulumi\nKUBECONFIG=x python -m infra rollout --stack prod --no-such\n```\n\n"
            "```sh\n# not run: the suite\nbin/plan --stack prod --gpu-memory-utilisation 0.9\n```\n\n"
            "```sh\nkubectl get pods -o json | python -m infra benchmark-report - --stak prod\n```\n\n<!-- generated: output: x -->\n\n"
            "```sh\npython -m infra ephemeral up --ttl\npython -m infra ephemeral upp\npython -m infra plan --root .\n```\n")  # fmt: skip
    blocks = _docs(tmp_path, text)
    assert [b.kind for b in blocks] == ["needs", "not run", "generated", "run"]
    problems = [p for b in blocks for p in block_flag_problems(b)]
    assert [p.split(": ")[0] for p in problems] == ["README.md:3", "README.md:8", "README.md:12", "README.md:18", "README.md:19", "README.md:20"], problems
    assert "--no-such" in problems[0] and "--gpu-memory-utilisation" in problems[1] and "--stak" in problems[2]
    assert "--ttl of `python -m infra ephemeral up` takes a value" in problems[3]
    assert "has no command 'upp'" in problems[4] and "hidden option" in problems[5]


def test_a_synopsis_parses(tmp_path):
    (block,) = _docs(tmp_path, "```sh\npython -m infra plan --model NAME_OR_PATH --instance-type T --nodes N \\\n"
                               "    [--tp N] [--expert-parallel | --no-expert-parallel] [--speculative-method mtp [--num-speculative-tokens N]] [--json]\n```\n")  # fmt: skip
    assert block_flag_problems(block) == []
    (cmd,) = parse_block(block).commands
    assert run_argv(cmd)[0] is None  # placeholders: parsed only


def test_markers(tmp_path):
    blocks = _docs(tmp_path, "```sh\n# needs: cloud\npulumi up\n```\n\n```sh\npulumi up --stack prod\n$(pulumi stack output x)\n```\n")
    assert "the words are from aws, pulumi, cluster, docker" in block_flag_problems(blocks[0])[0]
    problems = block_run_problems(blocks[1], Runner(tmp_path))
    assert len(problems) == 2 and all("mark the block (first line `# needs: pulumi`)" in p for p in problems), problems


def test_a_run_checks_status_and_facts(tmp_path, runner):
    text = ("```sh\npython -m infra check --stack prod   # exit 1: wrongly expected\n"
            "python -m infra perf --model llama-3.1-70b --gpu H100-SXM-80GB --tp 8 --isl 1024 --osl 1024 --concurrency 1,4 [--json]\n```\n")  # fmt: skip
    (block,) = _docs(tmp_path, text)
    problems = block_run_problems(block, runner)
    assert len(problems) == 1 and problems[0].startswith("README.md:2: `python -m infra check --stack prod` exited 0, the doc expects 1"), problems


def test_a_changed_fact_is_named(runner):
    argv = ["plan", "--stack", "prod"]
    run = runner.run(argv, {}, None, {})
    assert fact_problems(argv, run, {}) == []
    changed = re.sub(r"TP (\d+) x PP", lambda m: f"TP {int(m[1]) * 2} x PP", run.stdout)
    changed = re.sub(r"--max-num-seqs \d+", "--max-num-seqs 7", changed)
    problems = fact_problems(argv, dataclasses.replace(run, stdout=changed), {})
    assert len(problems) == 2 and "the plan's layout" in problems[0] and "the plan's --max-num-seqs" in problems[1], problems


def test_a_piped_command_from_outside_is_not_run(tmp_path):
    (block,) = _docs(tmp_path, "```sh\nkubectl -n NS get pods -o json \\\n    | python -m infra benchmark-report - --stack prod\n```\n")
    problems = block_run_problems(block, Runner(tmp_path))
    assert any("kubectl needs a running cluster" in p for p in problems)
    assert any("reads kubectl's output through a pipe" in p for p in problems), problems


def test_a_flag_cut_in_the_help_is_named(tmp_path, monkeypatch):
    import sys

    monkeypatch.setattr(sys.modules[__name__], "help_text", lambda path: "  --gpu-memory-utiliz… <float>\n  --help")
    (block,) = _docs(tmp_path, "```sh\n# needs: aws\npython -m infra plan --gpu-memory-utilization 0.9 --help\n```\n")
    assert block_flag_problems(block) == ["README.md:3: `python -m infra plan --gpu-memory-utilization 0.9 --help`: "
                                          "--gpu-memory-utilization is not whole in `python -m infra plan --help` at 80 columns"]
