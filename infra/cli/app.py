"""`python -m infra`: offline tools that need no cloud account.

    python -m infra plan --stack prod
    python -m infra plan --model deepseek-v4-pro --instance-type p5.48xlarge --nodes 4 [--vllm-version 0.34.0] [--json] [--chart budget.png]
    python -m infra perf --model llama-3.1-70b --gpu H100-SXM-80GB --tp 8 --isl 1024 --osl 1024 --concurrency 1,4,16,64 [--json] [--chart c.png] | --validate
    python -m infra synth --stack prod [--out prod.json]
    python -m infra diff base.json head.json
    python -m infra check --stack prod [--json]
    python -m infra scan --stack prod [--json] [--markdown out.md]   (checkov, offline)
    python -m infra ephemeral up [--from test] [--ttl 6] | test | down   (Pulumi CLI + AWS credentials)
    python -m infra preflight --stack prod [--region R] [--json] [--allow-unknown]   (AWS credentials, read-only)
    python -m infra sweep [--yes] [--region R ...] [--wait S] [--json]               (AWS credentials)
    python -m infra rollout --stack prod [--kubeconfig PATH] [--namespace NS] [--timeout S] [--once]   (the cluster's API, read-only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.errors import UserError
from infra.planning import Plan, PlanRequest, make_plan
from infra.planning.perf import published_error
from infra.planning.performance import RATE_LOW
from infra.planning.request import KV_CACHE_DTYPES, SPECULATIVE_CHOICES, WEIGHT_FORMAT_CHOICES
from infra.planning.vllm_release import supported_range

# rich_markup_mode=None: click's plain help layout for every command and subcommand (they
# inherit it). Typer's rich panels cut long option names at 80 columns (a plain terminal,
# a CI log: `--gpu-memory-utiliz…`); click's layout puts a long option on a line of its own,
# whole, with no box drawing or colour to garble a log (tests/test_cli_help.py).
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="Offline tools of the GPU serving stack.")

GiB = 2**30


@app.callback()
def _main() -> None:
    """Offline tools of the GPU serving stack."""


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB"


def _usd(n: float | None) -> str:
    return "-" if n is None else f"${n:,.2f}"


def _tokens(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:,.2f}{unit}"
    return f"{n:,.0f}"


def _table(title: str, *columns: str) -> Table:
    """A table of figures: one label column, right-aligned numbers."""
    table = Table(title=title, title_justify="left", title_style="bold")
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    return table


def _facts(title: str) -> Table:
    """A two-column table of named values, no header."""
    table = Table(title=title, title_justify="left", title_style="bold", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    return table


def render(plan: Plan, console: Console) -> None:
    data = plan.to_json_dict()
    m, lay, kv = data["model"], data["layout"], data["kv_cache"]

    t = _facts("Model and layout")
    t.add_row("model", escape(f"{m['name']} ({m['model_type']})"))
    t.add_row("parameters", f"{m['params_total'] / 1e9:,.1f}B total, {m['params_active'] / 1e9:,.1f}B active")
    t.add_row("weights", f"{m['weight_bytes'] / 1e9:,.1f} GB ({m['weight_format']})")
    t.add_row("hardware", f"{lay['nodes']} x {data['instance']['type']} ({lay['gpus_per_node']} x {data['instance']['gpu']} each)")
    t.add_row("layout", f"TP {lay['tp']} x PP {lay['pp']} x DP {lay['dp']}, expert parallel {'on' if lay['expert_parallel'] else 'off'}")
    t.add_row("layers per stage", ", ".join(map(str, lay["layers_per_stage"])) or "-")
    t.add_row("feasible", "[green]yes[/green]" if data["feasible"] else "[red]no[/red]")
    console.print(t)

    if plan.stages:
        t = _table("Per-rank memory budget (one GPU of each pipeline stage)", "", *[f"stage {s.stage}" for s in plan.stages])
        rows = [
            ("layers", lambda s: str(s.layers)),
            ("visible (CUDA)", lambda s: _gib(s.gpu_visible_bytes)),
            ("weights", lambda s: _gib(s.weights_bytes)),
            ("activation peak", lambda s: _gib(s.activation_bytes)),
            ("communication buffers", lambda s: _gib(s.comm_buffer_bytes)),
            ("CUDA overhead", lambda s: _gib(s.cuda_overhead_bytes)),
            ("  of which CUDA graphs", lambda s: _gib(s.cudagraph_bytes)),
            ("KV cache", lambda s: _gib(s.kv_cache_bytes)),
            ("headroom", lambda s: _gib(s.headroom_bytes)),
            ("KV bytes per block", lambda s: f"{s.kv_bytes_per_block:,}"),
            ("KV blocks", lambda s: f"{s.num_blocks:,}"),
            ("sequences at max-model-len", lambda s: f"{s.max_sequences:,.2f}"),
        ]
        for label, fn in rows:
            t.add_row(label, *[fn(s) for s in plan.stages])
        t.caption = f"most constrained: stage {data['per_rank']['stage']}"
        console.print(t)

        v = data["vllm"]
        t = _facts(f"KV cache capacity (vLLM {v['version']})")
        t.add_row("dtype", kv["dtype"])
        t.add_row("blocks (minimum over stages)", f"{kv['num_blocks']:,} of {kv['bytes_per_block']:,} B (block size {kv['block_size']})")
        t.add_row("blocks per request", f"{kv['blocks_per_request']:,} ({_gib(kv['bytes_per_request'])} on the constrained rank)")
        t.add_row("concurrent sequences", f"{kv['max_concurrency']:,.2f} at max-model-len {kv['max_model_len']:,}")
        t.add_row("tokens (all replicas)", f"{kv['tokens']:,}")
        t.add_row("batching", f"--max-num-batched-tokens {v['max_num_batched_tokens']:,}, async scheduling "
                  f"{'on' if v['async_scheduling'] else 'off'}: sliding windows hold {v['sliding_window_in_flight_tokens']:,} in-flight tokens")
        if v.get("speculative"):
            t.add_row("speculative decoding", f"{v['speculative']['method']}, {v['speculative']['num_speculative_tokens']} draft "
                      "token(s) a step: the draft layer's weights, KV cache and CUDA graphs counted")
        t.add_row("CUDA graphs", v["cudagraph_accounting"])
        console.print(t)

        t = _table(f"KV cache groups (one block pool; stage {data['per_rank']['stage']}, the constrained rank)",
                   "kind", "layers", "on rank", "block", "page B", "block B", "per request")
        t.columns[0].no_wrap = True
        for g in kv["groups"]:
            pages = " ".join(f"{p:,}" for p in g["layer_page_bytes"])
            t.add_row(escape(g["kind"]), str(g["layers"]), str(g["layers_on_rank"]), str(g["block_size"]), pages,
                      f"{g['page_bytes']:,}", f"{g['blocks_per_request']:,}")
        t.caption = f"max concurrency = {kv['num_blocks']:,} blocks / {kv['blocks_per_request']:,} per request"
        console.print(t)

    _render_performance(data, console)

    t = _facts("Serving arguments")
    t.add_row("vllm serve", " ".join(data["vllm_args"]))
    t.add_row("ray start", " ".join(f"--{k}={v}" for k, v in data["ray_start_params"].items()))
    pod = data["pod"]
    t.add_row("pod requests", f"{pod['cpu']} CPU, {_gib(pod['memory_bytes'])}, {pod['gpus']} GPU, {pod['efa_interfaces']} EFA")
    t.add_row("/dev/shm", _gib(pod["shm_bytes"]))
    t.add_row("node root volume", f"{data['node']['root_volume_gib']} GiB gp3, encrypted (images and caches)")
    if sn := data.get("system_nodes"):  # infra/planning/system_nodes.py
        t.add_row("system nodes", f"{sn['count']} x {sn['instance_type']}: pods request {sn['requests_cpu_m']:,}m CPU and {sn['requests_memory_mib']:,} MiB "
                  f"(about {sn['expected_memory_mib']:,} MiB in use) of {sn['count'] * sn['allocatable_memory_mib']:,} MiB allocatable; "
                  f"largest pod {sn['largest_pod']} {sn['largest_pod_memory_mib']:,} MiB")
    st = data["storage"]
    t.add_row("weight storage", f"{_gib(st['size_bytes'])} for a {st['checkpoint_bytes'] / 1e9:,.0f} GB checkpoint")
    t.add_row("read throughput", f"{st['required_read_bytes_per_s'] / 2**20:,.0f} MiB/s in all, for a {st['cold_start_target_s']:,.0f} s cold start")
    t.add_row("estimated cold start", f"{st['estimated_cold_start_s']:,.0f} s, engine start included (Start-up below)")
    console.print(t)
    _render_startup(data["startup"], console)

    c = data["cost"]
    t = _facts("Cost")
    t.add_row("cloud, hourly", _usd(c["hourly_usd"]))
    t.add_row("cloud, monthly (730 h)", _usd(c["monthly_usd"]))
    _render_cold_start_cost(data["cold_start_cost"], t)
    for name, value in c["tco_categories"].items():
        t.add_row(f"TCO: {name}", _usd(value))
    if c["tco_monthly_usd"] is not None:
        t.add_row("TCO, monthly", _usd(c["tco_monthly_usd"]))
    if c["throughput_tokens_per_s"]:
        per = c["usd_per_million_tokens"]
        basis = (f"{c['throughput_tokens_per_s']:,.0f} output tokens/s {c['throughput_source']}"
                 + (f" x duty cycle {c['duty_cycle']:g}" if c["duty_cycle"] != 1 else ""))
        t.add_row("cost per million output tokens", f"{_usd(per['cloud'])} cloud" + (f", {_usd(per['tco'])} TCO" if per["tco"] else "")
                  + f" (at {basis})")
        if c["measured_tokens_per_s"] and c["predicted_tokens_per_s"]:
            t.add_row("measured / predicted", f"{c['measured_tokens_per_s']:,.0f} / {c['predicted_tokens_per_s']:,.0f} output tokens/s "
                      f"= {c['measured_tokens_per_s'] / c['predicted_tokens_per_s']:.2f}")
        t.add_row("tokens per month within the SLA", f"{_tokens(c['capacity_tokens_per_month'])} output tokens")
    else:
        t.add_row("cost per million output tokens", "- (no SLA capacity predicted, and no gpu-serving:cost.throughputTokensPerSecond)")
    be = c["breakeven"]
    if be:
        t.add_row(
            f"break-even vs API at ${c['api_price_usd_per_mtok']:.2f}/M",
            f"{_tokens(be['tokens_per_month'])} tokens/month ({_tokens(be['tokens_per_day'])}/day)",
        )
        t.add_row("verdict", escape(be["verdict"]))
    console.print(t)

    for n in data["vllm"]["notes"]:
        console.print(f"[cyan]chosen:[/cyan] {escape(n)}")
    for e in data["errors"]:
        console.print(f"[red]error:[/red] {escape(e)}")
    for w in data["warnings"]:
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    for a in data["assumptions"]:
        console.print(f"[dim]model assumption:[/dim] {escape(a)}")


def _render_performance(data: dict, console: Console) -> None:
    perf = data.get("performance")
    if not perf:
        return
    sla, cap, w = perf["sla"], perf["sla_capacity"], perf["workload"]
    itl = f", ITL p99 < {sla['itl_p99_ms']:g} ms" if sla["itl_p99_ms"] else ""
    t = _facts(f"Performance (predicted; SLA TTFT p99 < {sla['ttft_p99_ms']:g} ms, TPOT p99 < {sla['tpot_p99_ms']:g} ms{itl})")
    t.add_row("workload", escape(w["describe"]))
    t.add_row("objective", escape(data["objective"]))
    if not cap["concurrency"]:
        t.add_row("SLA capacity", f"[red]none[/red]: {escape(perf['refusal'])}")
    else:
        rate = (f"or {cap['requests_per_s']:,.2f} requests/s (Poisson)" if cap["requests_per_s"] else
                f"but no Poisson rate at {RATE_LOW:.0%} of their request rate or above meets it")
        t.add_row("SLA capacity", f"{cap['concurrency']:,} concurrent requests, {rate}; then {escape(cap['binding'])} binds")
        t.add_row("throughput there", f"{cap['closed_loop_requests_per_s']:,.2f} requests/s, {cap['input_tokens_per_s']:,.0f} input + "
                  f"{cap['output_tokens_per_s']:,.0f} output tokens/s ({cap['output_tokens_per_s_per_gpu']:,.1f} output per GPU)")
        t.add_row("latency there", f"TTFT p50 {cap['ttft_ms']['p50']:,.0f} / p99 {cap['ttft_ms']['p99']:,.0f} ms, "
                  f"TPOT p50 {cap['tpot_ms']['p50']:,.1f} / p99 {cap['tpot_ms']['p99']:,.1f} ms")
    one = perf["single_request"]
    t.add_row("one request at a time", f"TTFT p99 {one['ttft_ms']['p99']:,.0f} ms, TPOT p99 {one['tpot_ms']['p99']:,.1f} ms")
    v = data["vllm"]
    t.add_row("--max-num-seqs", f"{v['max_num_seqs']:,} (set by {escape(v['max_num_seqs_bound'])})")
    if data.get("runner_up"):
        t.add_row("runner-up", escape(data["runner_up"]["why"]))
    t.add_row("model error", escape(published_error.describe(perf["model_error"])))
    console.print(t)
    t = _table("Predicted curve (closed loop, steady state)", "concurrency", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "req/s",
               "out tok/s", "per GPU", "SLA")
    for p in perf["curve"]:
        t.add_row(f"{p['concurrency']:,}", f"{p['ttft_ms']['p50']:,.0f} / {p['ttft_ms']['p99']:,.0f}",
                  f"{p['tpot_ms']['p50']:,.1f} / {p['tpot_ms']['p99']:,.1f}", f"{p['requests_per_s']:,.2f}",
                  f"{p['output_tokens_per_s']:,.0f}", f"{p['output_tokens_per_s_per_gpu']:,.1f}",
                  "meets" if p["meets_sla"] else "misses " + "+".join(p["misses"]) if p["misses"] else "preempts")
    console.print(t)


def _render_cold_start_cost(cs: dict, t: Table) -> None:
    """What one cold start costs, and the first `up` on top (infra/planning/cold_start_cost.py)."""
    store = "EFS" if cs["storage_kind"] == "efs" else "FSx for Lustre"
    reads = (f"{store} reads {cs['read_bytes'] / 2**30:,.0f} GiB (the checkpoint once per node) {_usd(cs['read_usd'])}"
             if cs["read_usd"] else f"{store} reads: no per-read charge")  # fmt: skip
    t.add_row("one cold start", f"{_usd(cs['usd'])}: GPU nodes {cs['gpu_wait_s']:,.0f} s before serving "
              f"{_usd(cs['gpu_wait_usd'])} + {reads}")  # fmt: skip
    writes = (f"staging writes {cs['staging_write_bytes'] / 2**30:,.0f} GiB {_usd(cs['staging_write_usd'])}; "
              if cs["staging_write_usd"] else "")  # fmt: skip
    t.add_row("first `up`, besides", f"{writes}GPU nodes idle while the weights stage: up to {cs['staging_s_at_most'] / 3600:,.1f} h, "
              f"{_usd(cs['staging_gpu_idle_usd_at_most'])} (at {cs['staging_bytes_per_s'] / 2**20:,.0f} MiB/s, the slowest download staging accepts)")  # fmt: skip


def _render_startup(su: dict, console: Console) -> None:
    """The head's start, from one calculation (infra/planning/startup.py)."""
    t = _facts("Start-up (one calculation: probe, the wait for the head and vLLM's timeouts follow the cold start)")
    cache = "holds it" if su["page_cache_holds_checkpoint"] else "[yellow]does not hold it: parts may be read twice[/yellow]"
    t.add_row("each node reads", f"{su['node_read_bytes'] / 1e9:,.0f} GB (the whole checkpoint) at {su['node_read_bytes_per_s'] / 2**20:,.0f} MiB/s: {su['weights_read_s']:,.0f} s")
    t.add_row("page cache", f"{_gib(su['page_cache_bytes'])} per pod, {cache}")
    t.add_row("cold start", f"{su['cold_start_s']:,.0f} s ({su['engine_init_s']:,.0f} s engine init, {su['compile_s']:,.0f} s of it compiling)")
    t.add_row("restart", f"{su['restart_s']:,.0f} s for a container restart (the pod's compile cache kept)")
    t.add_row("startup probe", f"{su['startup_budget_s']:,} s ({su['startup_probe_failure_threshold']} x {su['startup_probe_period_s']} s): {su['ray_join_timeout_s']:,} s Ray join + the engine's {su['engine_ready_timeout_s']:,} s")
    t.add_row("VLLM_ENGINE_READY_TIMEOUT_S", f"{su['engine_ready_timeout_s']:,}")
    t.add_row("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", f"{su['execute_model_timeout_s']:,}")
    t.add_row("head Ready within", f"{su['ready_wait_s']:,} s once placed: the startup probe + {su['image_pull_allowance_s']:,} s image pull "
              "(`rollout` waits that long; `pulumi up` waits for neither the weights nor the head)")
    console.print(t)


def _request_from_stack(stack: str, root: Path | None) -> PlanRequest:
    from infra.config import load_stack_file

    return load_stack_file(stack, root).plan_request()


@app.command(no_args_is_help=True)
def plan(
    stack: Optional[str] = typer.Option(None, help="Plan a stack from Pulumi.<stack>.yaml."),
    model: Optional[str] = typer.Option(None, help="Catalog name, config.json, or model directory."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type"),
    nodes: Optional[int] = typer.Option(None),
    tp: Optional[int] = typer.Option(None, help="Tensor parallel size (default: searched)."),
    pp: Optional[int] = typer.Option(None, help="Pipeline parallel size (default: searched)."),
    dp: Optional[int] = typer.Option(None, help="Data parallel size, model replicas (default: searched)."),
    expert_parallel: Optional[bool] = typer.Option(None, "--expert-parallel/--no-expert-parallel", help="Expert parallel for MoE models (default: searched)."),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len"),
    gpu_memory_utilization: Optional[float] = typer.Option(None, "--gpu-memory-utilization"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens", help="Default: searched (vLLM's unless a smaller chunk admits markedly more)."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", help="Default: what the KV cache admits at a typical context."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version", help=f"vLLM release whose accounting to follow ({supported_range()})."),
    speculative_method: Optional[str] = typer.Option(None, "--speculative-method", help=f"Speculative decoding: {', '.join(SPECULATIVE_CHOICES)} (mtp: the model's MTP layers; unset: the sla-throughput-per-dollar search tries it)."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens", help="Tokens drafted per step (default 1 with a method)."),
    kv_cache_dtype: Optional[str] = typer.Option(None, "--kv-cache-dtype", help=f"One of: {', '.join(KV_CACHE_DTYPES)}."),
    weight_format: Optional[str] = typer.Option(None, "--weight-format", help=f"One of: {', '.join(WEIGHT_FORMAT_CHOICES)} (default: the checkpoint's own)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    chart: Optional[Path] = typer.Option(None, help="Draw the per-stage memory budget to FILE (.png or .svg)."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="Directory holding the stack files."),
) -> None:
    """Plan the serving layout and every derived number, offline."""
    console = Console()
    try:
        if stack:
            req = _request_from_stack(stack, root)
        else:
            if not (model and instance_type and nodes is not None):
                raise UserError("give --stack NAME, or --model, --instance-type and --nodes")
            req = PlanRequest(model=model, instance_type=instance_type, nodes=nodes)
        overrides = {
            "model": model, "instance_type": instance_type, "nodes": nodes, "tp": tp, "pp": pp, "dp": dp,
            "expert_parallel": expert_parallel, "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization, "max_num_batched_tokens": max_num_batched_tokens,
            "max_num_seqs": max_num_seqs, "kv_cache_dtype": kv_cache_dtype, "weight_format": weight_format,
            "vllm_version": vllm_version, "speculative_method": speculative_method,
            "num_speculative_tokens": num_speculative_tokens,
        }  # fmt: skip
        req = req.replace(**{k: v for k, v in overrides.items() if v is not None})
        if chart is not None and chart.suffix.lower() not in (".png", ".svg"):
            raise UserError(f"--chart takes a .png or .svg file, got {chart.name!r}")
        result = make_plan(req)
    except UserError as err:
        Console(stderr=True).print(f"[red]error:[/red] {escape(str(err))}", soft_wrap=True)
        raise typer.Exit(2)
    if chart is not None:
        from infra.cli.budget_plot import draw_budget

        try:
            draw_budget(result, chart)
        except OSError as err:
            Console(stderr=True).print(f"[red]error:[/red] cannot write --chart {escape(str(chart))}: {escape(str(err.strerror or err))}", soft_wrap=True)
            raise typer.Exit(2)
    if as_json:
        sys.stdout.write(json.dumps(result.to_json_dict(), indent=2) + "\n")
    else:
        render(result, console)
        if chart is not None:
            console.print(f"chart written to {escape(str(chart))}", soft_wrap=True)  # a path the user copies: never broken across lines
    if not result.feasible:
        raise typer.Exit(1)


def _one_line(message: str) -> str:
    """A user error on one line: a message's own list items joined with '; '."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else message
    return lines[0] + " " + "; ".join(line.removeprefix("- ") for line in lines[1:])


def _fail(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(_one_line(message))}", soft_wrap=True)
    raise typer.Exit(2)


@app.command(no_args_is_help=True)
def synth(
    stack: str = typer.Option(..., help="Synthesise the stack of Pulumi.<stack>.yaml."),
    out: Optional[Path] = typer.Option(None, help="Write the document to FILE instead of stdout."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="The Pulumi project directory (Pulumi.yaml, __main__.py, stack files)."),
) -> None:
    """Run the program offline (mocked engine) and write every resource it declares as JSON."""
    from infra.preview.synth import dump, synthesize

    try:
        text = dump(synthesize(stack, root))
    except UserError as err:
        _fail(str(err))
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)  # `--out out/prod.json` on a fresh clone, as the docs show
        out.write_text(text)
    except OSError as err:
        _fail(f"cannot write --out {out}: {err.strerror or err}")


@app.command(name="diff", no_args_is_help=True)
def diff_command(
    base: Path = typer.Argument(..., help="Synth document before the change (e.g. of the base branch)."),
    head: Path = typer.Argument(..., help="Synth document after the change."),
) -> None:
    """Print what changes between two synth documents, as Markdown for a pull-request comment."""
    from infra.preview.diff import diff, load, render_markdown

    try:
        text = render_markdown(diff(load(base), load(head)))
    except UserError as err:
        _fail(str(err))
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


@app.command(name="benchmark-report", no_args_is_help=True)
def benchmark_report_command(
    source: str = typer.Argument(..., help="File, or - for stdin: `kubectl get pods -l job-name=NAME-benchmark -o json`, or the Job's log."),
    stack: Optional[str] = typer.Option(None, help="Price the measured throughput with Pulumi.<stack>.yaml's cost inputs."),
    as_json: bool = typer.Option(False, "--json", help="Print the Job's summary as JSON."),
) -> None:
    """The benchmark Job's outcome, measured beside predicted, in the plan's terms. Exit 1 when it missed the SLA."""
    from infra.cli import benchmark_report as br

    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as err:
        _fail(f"cannot read {source}: {err.strerror or err}")
    try:
        summary = br.read_summary(text)
        extra = br.cost_at_measurement(summary, stack) if stack else []
    except UserError as err:
        _fail(str(err))
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    else:
        console = Console()
        t = _table("Benchmark: measured against the plan's prediction for the same load",
                   "metric", "predicted", "measured", "measured / predicted")  # fmt: skip
        for r in br.rows(summary):
            t.add_row(r.metric, "-" if r.predicted is None else f"{r.predicted:,.2f}",
                      "-" if r.measured is None else f"{r.measured:,.2f}", "-" if r.ratio is None else f"{r.ratio:.2f}")  # fmt: skip
        console.print(t)
        console.print(escape(br.verdict_line(summary)))
        for line in extra:
            console.print(escape(line))
    raise typer.Exit(0 if summary.get("passed") else 1)


@app.command(no_args_is_help=True)
def rollout(
    stack: str = typer.Option(..., help="Follow the stack of Pulumi.<stack>.yaml."),
    kubeconfig: Optional[Path] = typer.Option(None, help="The stack's kubeconfig (default: $KUBECONFIG, else ~/.kube/config)."),
    namespace: Optional[str] = typer.Option(None, help="The serving namespace (default: the stack's)."),
    timeout: Optional[float] = typer.Option(None, min=0, help="Give up after this many seconds (default: the staging deadline + the head's start)."),
    once: bool = typer.Option(False, "--once", help="Look once, print every step, exit (4 while under way)."),
    poll: float = typer.Option(10.0, min=0, hidden=True, help="Seconds between looks."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="Directory holding the stack files."),
) -> None:
    """Follow what `pulumi up` leaves running: staging, the RayCluster's pods, Ray, vLLM, the endpoint (read-only).

    Exit status: 0 the endpoint answers, 1 a step failed or time ran out, 2 usage or API unreachable,
    3 serving but not reachable through the API server's Service proxy, 4 (--once) still under way.
    """
    from infra.cli import rollout as ro
    from infra.ops.kubeapi import KubeApi, default_kubeconfig_path

    try:
        api = KubeApi.from_kubeconfig(kubeconfig or default_kubeconfig_path())
        targets = ro.targets_for_stack(stack, root, namespace)
        code = ro.follow(api, targets, timeout_s=timeout, once=once, poll_s=poll, out=lambda line: print(line, flush=True))
    except UserError as err:
        _fail(str(err))
    raise typer.Exit(code)


@app.command(no_args_is_help=True)
def check(
    stack: str = typer.Option(..., help="Check the stack of Pulumi.<stack>.yaml."),
    as_json: bool = typer.Option(False, "--json", help="Print the rules and violations as one JSON object."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="The Pulumi project directory (Pulumi.yaml, __main__.py, stack files)."),
) -> None:
    """Synthesise the stack offline and run the policy pack's rules (policies/) over it.

    Exit status: 0 when every mandatory rule passes, 1 when one fails, 2 on a usage or config error.
    """
    from infra.preview.policy_check import check_stack, report

    try:
        doc, violations = check_stack(stack, root)
    except UserError as err:
        _fail(str(err))
    result = report(doc, violations)
    if as_json:
        sys.stdout.write(json.dumps(result, indent=2) + "\n")
    else:
        console = Console()
        if violations:
            t = Table(title=f"Policy violations: stack {escape(stack)}", title_justify="left", title_style="bold")
            t.add_column("resource", overflow="fold", max_width=32)
            t.add_column("rule", no_wrap=True)
            t.add_column("level", no_wrap=True)
            t.add_column("message", overflow="fold", ratio=1)
            for v in violations:
                level = f"[red]{v.enforcement}[/red]" if v.mandatory else f"[yellow]{v.enforcement}[/yellow]"
                t.add_row(escape(v.name or v.urn or "(stack)"), escape(v.rule), level, escape(v.message))
            console.print(t)
            failed = sorted({v.rule for v in violations})
            console.print(f"{len(violations)} violation(s) of {len(failed)} of {len(result['rules'])} rules: {escape(', '.join(failed))}", soft_wrap=True)
        else:
            console.print(f"All {len(result['rules'])} policy rules passed: stack {escape(stack)}, {result['resources']} resources.", soft_wrap=True)
    if not result["passed"]:
        raise typer.Exit(1)


def _findings_table(title: str, last: str, rows: list[tuple[str, str, str]]) -> Table:
    """checkov findings: check, resource and `last` (the check's title, or why it is accepted)."""
    t = Table(title=title, title_justify="left", title_style="bold")
    t.add_column("check", no_wrap=True)
    t.add_column("resource", overflow="fold")
    t.add_column(last, overflow="fold", ratio=1)
    for row in rows:
        t.add_row(*(escape(x) for x in row))
    return t


@app.command(no_args_is_help=True)
def scan(
    stack: str = typer.Option(..., help="Scan the stack of Pulumi.<stack>.yaml."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as one JSON object."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the result as Markdown (a pull-request comment) to FILE."),
    accepted: Optional[Path] = typer.Option(None, "--accepted", help="The accepted risks (default: policies/accepted-risks.yaml)."),
    checkov: Optional[Path] = typer.Option(None, "--checkov", help="The checkov executable (default: venv-scan/bin/checkov, installed from requirements-scan.txt on first use)."),
    no_install: bool = typer.Option(False, "--no-install", help="Do not install checkov into venv-scan/ when it is missing or out of date: fail instead."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="The Pulumi project directory (Pulumi.yaml, __main__.py, stack files)."),
) -> None:
    """Synthesise the stack offline, convert it to a Terraform plan and Kubernetes manifests, and run checkov over them.

    Exit status: 0 when every finding is accepted, 1 when one is not (or the conversion or checkov failed),
    2 on a usage, config or accepted-risks error, or a missing checkov.
    """
    from infra.preview.scan import FRAMEWORK_TITLES, FRAMEWORKS, render_markdown, scan_stack

    err = Console(stderr=True)
    try:
        result = scan_stack(stack, root, accepted_path=accepted, checkov=checkov, install=not no_install,
                            log=lambda m: err.print(escape(m), soft_wrap=True))  # fmt: skip
    except UserError as e:
        _fail(str(e))
    if markdown is not None:
        try:
            markdown.write_text(render_markdown(result) + "\n")
        except OSError as e:
            _fail(f"cannot write --markdown {markdown}: {e.strerror or e}")
    if as_json:
        sys.stdout.write(json.dumps(result.to_json_dict(), indent=2) + "\n")
    else:
        console = Console()
        t = _table(f"checkov {result.checkov_version}: stack {escape(stack)}", "framework", "resources", "passed", "failed", "accepted", "not accepted")
        for fw in FRAMEWORKS:
            c, acc = result.counts[fw], result.accepted_in(fw)
            t.add_row(FRAMEWORK_TITLES[fw], str(c.resources), str(c.passed), str(c.failed), str(acc), str(c.failed - acc))
        console.print(t)
        for e in result.errors:
            console.print(f"[red]error:[/red] {escape(e)}", soft_wrap=True)
        if result.not_accepted:
            console.print(_findings_table("Findings not accepted", "title", [(f.check, f.resource, f.name) for f in result.not_accepted]))
        if result.accepted:
            console.print(_findings_table("Accepted", "reason", [(f.check, f.resource, r.reason) for f, r in result.accepted]))
        for r in result.stale:
            console.print(f"[yellow]stale:[/yellow] {escape(r.check)} on {escape(r.resource)} matches no finding of stack {escape(stack)}: remove it from the accepted risks unless another stack needs it", soft_wrap=True)
        for g in result.gaps:
            console.print(f"[dim]not scanned:[/dim] {escape(g.resource)} ({escape(g.type)}): {escape(g.reason)}", soft_wrap=True)
        verdict = "every finding is accepted" if result.passed else f"{len(result.not_accepted)} finding(s) not accepted"
        console.print(f"{verdict}: stack {escape(stack)}", soft_wrap=True)
    if not result.passed:
        raise typer.Exit(1)


# `python -m infra perf`: predicted latency and throughput (infra/cli/perf.py).
from infra.cli.perf import perf as _perf  # noqa: E402

app.command(name="perf")(_perf)

# `python -m infra docs`: the generated regions of README.md and docs/ (infra/docs.py).
from infra.cli.docs import docs as _docs  # noqa: E402

app.command(name="docs")(_docs)

# `python -m infra ephemeral up | test | down`: short-lived test stacks (infra/ops/ephemeral/).
from infra.ops.ephemeral.cli import app as _ephemeral_app  # noqa: E402

app.add_typer(_ephemeral_app, name="ephemeral")


@app.command(no_args_is_help=True)
def preflight(
    stack: str = typer.Option(..., help="Check the stack of Pulumi.<stack>.yaml against the AWS account."),
    region: Optional[str] = typer.Option(None, help="AWS region (default: the stack's aws:region)."),
    as_json: bool = typer.Option(False, "--json", help="Print the checks as one JSON object."),
    allow_unknown: bool = typer.Option(False, "--allow-unknown", help="Exit 0 when the only non-go checks are unknown (not readable)."),
    root: Optional[Path] = typer.Option(None, hidden=True, help="Directory holding the stack files."),
) -> None:
    """Go/no-go before `pulumi up`: GPU offering, vCPU quotas, reservation, EFA, EKS and add-on versions, AMI release, VPC/NAT/EIP quotas (boto3).

    Exit status: 0 all go, 1 a no-go (or an unknown, without --allow-unknown), 2 config or credentials error.
    """
    from infra.ops import preflight as pf

    try:
        target, checks = pf.preflight(stack, region=region, root=root)
    except UserError as err:
        _fail(str(err))
    except Exception as err:  # noqa: BLE001 - botocore configuration errors (no region, bad profile) are usage errors
        if type(err).__module__.startswith("botocore"):
            _fail(f"AWS configuration: {err}")
        raise
    if as_json:
        sys.stdout.write(json.dumps(pf.to_json_dict(target, checks, allow_unknown), indent=2) + "\n")
    else:
        pf.render(target, checks, Console(), allow_unknown)
    if not pf.all_go(checks, allow_unknown):
        raise typer.Exit(1)


@app.command(name="sweep")
def sweep_command(
    yes: bool = typer.Option(False, "--yes", help="Delete. Without it: a dry run that only lists."),
    region: Optional[list[str]] = typer.Option(None, "--region", help="Region to sweep; repeat for more (default: boto3's configured region)."),
    wait: float = typer.Option(900.0, "--wait", min=0, help="Seconds to wait per step for AWS to finish deleting (bounded poll)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object (progress goes to stderr)."),
) -> None:
    """Delete resources of expired ephemeral stacks (tags project, lifecycle=ephemeral, expires-at < now).

    Never touches a resource without those tags, with lifecycle=production, or with an
    unreadable expires-at. Exit status: 0 nothing failed, 1 a deletion or listing failed, 2 no region or credentials.
    """
    from infra.ops import sweep as sw

    progress = sw.RichProgress(Console(stderr=True))
    try:
        report = sw.sweep(region or None, yes=yes, wait=wait, progress=progress)
    except UserError as err:
        progress.close()
        _fail(str(err))
    except Exception as err:  # noqa: BLE001
        progress.close()
        if type(err).__module__.startswith("botocore"):
            _fail(f"AWS configuration: {err}")
        raise
    progress.close()
    if as_json:
        sys.stdout.write(json.dumps(report.to_json_dict(), indent=2) + "\n")
    else:
        sw.render(report, Console())
    if not report.ok:
        raise typer.Exit(1)


def main() -> None:
    app()
