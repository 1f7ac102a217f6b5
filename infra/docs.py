"""Generated regions of README.md and docs/: `python -m infra docs` writes them from the code.

A region is

    <!-- generated: NAME -->
    ...what the generator writes...
    <!-- end generated -->

and NAME is one of

- `config-reference`: the config reference, from the pydantic models (infra/config/reference.py);
- `changes-table`: the table of common changes to a running stack (infra/preview/changes.py);
- `vllm-releases`: what changes between the vLLM releases the planner follows (infra/planning/vllm_release.py);
- `headline: STACK`: the plan's headline figures for a stack (layout, SLA capacity, cost, break-even);
- `output: COMMAND`: what `python -m infra COMMAND` prints, at a fixed width, in a `text` block.

tests/test_docs.py fails when a checked-in page differs from what this writes, so a changed
stack file, model or performance figure cannot leave the docs behind. Everything here is
offline and deterministic: no clock, no path of the machine it runs on.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

WIDTH = 120  # columns the `output:` regions are rendered at: the widest plan table fits without wrapping
# At the start of a line only: an indented example of the syntax (as in docs/architecture.md) is not a region.
REGION = re.compile(r"^(?P<open><!-- generated: (?P<name>[^\n]*?) -->\n)(?P<body>.*?)(?P<close>^<!-- end generated -->)", re.S | re.M)


@dataclass(frozen=True)
class Page:
    path: Path
    text: str


def pages(root: Path) -> list[Path]:
    """The Markdown files that may hold regions: the README and everything under docs/."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md")) if (root / "docs").is_dir() else found


def run_cli(args: list[str], root: Path | None = None, width: int = WIDTH) -> tuple[int, str]:
    """Run `python -m infra ARGS` in-process; its exit status and what it printed (stdout, then stderr).

    `root` is passed as the hidden `--root` of the commands that read stack files, so a test can
    point them at a changed copy of the stack files."""
    from typer.testing import CliRunner

    from infra.cli.app import app

    if root is not None and args and args[0] in _ROOTED:
        args = [*args, "--root", str(root)]
    env = {"COLUMNS": str(width), "TERM": "dumb", "NO_COLOR": "1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # rich reads the width from the environment when a Console is created
    try:
        result = CliRunner().invoke(app, args, catch_exceptions=False)
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return result.exit_code, result.stdout + (result.stderr if result.stderr_bytes else "")


_ROOTED = ("plan", "synth", "check", "scan", "preflight")  # the commands with a hidden --root


def _output(command: str, root: Path | None) -> str:
    args = shlex.split(command)
    status, text = run_cli(args, root)
    if status not in (0, 1):  # 1 is a finding (an infeasible plan, a failed check): still worth showing
        raise ValueError(f"`python -m infra {command}` exited {status}: {text.strip()[-500:]}")
    lines = [line.rstrip() for line in text.rstrip("\n").splitlines()]
    return "```text\n" + "\n".join(lines) + "\n```\n"


def _headline(stack: str, root: Path | None) -> str:
    """The figures a buyer asks first, as a Markdown table: what runs, what it serves within the SLA, at what price."""
    from infra.config import load_stack_file
    from infra.planning import make_plan

    d = make_plan(load_stack_file(stack, root).plan_request()).to_json_dict()
    lay, inst, perf, cost = d["layout"], d["instance"], d.get("performance") or {}, d["cost"]
    rows = [("model", f"{d['model']['name']} ({d['model']['weight_bytes'] / 1e9:,.1f} GB of weights, {d['model']['weight_format']})"),
            ("hardware", f"{lay['nodes']} x {inst['type']} ({lay['nodes'] * lay['gpus_per_node']} x {inst['gpu']})"),
            ("layout", f"TP {lay['tp']} x PP {lay['pp']} x DP {lay['dp']}, expert parallel {'on' if lay['expert_parallel'] else 'off'}")]  # fmt: skip
    sla, cap = perf.get("sla"), perf.get("sla_capacity")
    if sla and cap:
        rows += [("SLA", f"TTFT p99 < {sla['ttft_p99_ms']:g} ms, TPOT p99 < {sla['tpot_p99_ms']:g} ms ({perf['workload']['describe']})"),
                 ("SLA capacity", f"{cap['concurrency']} concurrent requests: {cap['output_tokens_per_s']:,.0f} output tokens/s, "
                                  f"TTFT p99 {cap['ttft_ms']['p99']:.0f} ms, TPOT p99 {cap['tpot_ms']['p99']:.1f} ms (predicted)")]  # fmt: skip
    rows.append(("cloud cost", f"${cost['hourly_usd']:,.2f} an hour, ${cost['monthly_usd']:,.0f} a month"))
    per_mtok = {k: v for k, v in (cost.get("usd_per_million_tokens") or {}).items() if v is not None}
    if per_mtok:
        rows.append(("per million output tokens", ", ".join(f"${v:.2f} {'TCO' if k == 'tco' else k}" for k, v in per_mtok.items())))
    if cost.get("breakeven"):
        be = cost["breakeven"]
        rows.append((f"break-even against an API at ${cost['api_price_usd_per_mtok']:.2f} per million",
                     f"{be['tokens_per_month'] / 1e9:,.2f}B tokens a month: {be['verdict']}"))
    out = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(out) + "\n"


def render_region(name: str, root: Path | None = None) -> str:
    """What the generator writes into the region called NAME."""
    kind, _, arg = name.partition(":")
    arg = arg.strip()
    if kind == "config-reference":
        from infra.config.reference import reference_markdown

        return reference_markdown()
    if kind == "changes-table":
        from infra.preview.changes import table_markdown

        return table_markdown()
    if kind == "vllm-releases":
        from infra.planning.vllm_release import changes_table

        return changes_table()
    if kind == "headline" and arg:
        return _headline(arg, root)
    if kind == "output" and arg:
        return _output(arg, root)
    raise ValueError(f"unknown generated region {name!r}: expected config-reference, changes-table, vllm-releases, headline: STACK or output: COMMAND")


def regenerate(text: str, root: Path | None = None) -> str:
    """TEXT with every region's body replaced by what the generator writes."""
    def body(name: str) -> str:
        out = render_region(name, root)
        return out if out.endswith("\n") else out + "\n"  # the end marker on a line of its own, or it is not found again

    return REGION.sub(lambda m: m["open"] + body(m["name"]) + m["close"], text)


def region_names(text: str) -> list[str]:
    return [m["name"] for m in REGION.finditer(text)]


def generate(root: Path, stacks_root: Path | None = None) -> list[Page]:
    """Every page under ROOT whose regions are out of date, with its regenerated text."""
    stale = []
    for path in pages(root):
        old = path.read_text()
        new = regenerate(old, stacks_root)
        if new != old:
            stale.append(Page(path, new))
    return stale
