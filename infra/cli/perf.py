"""`python -m infra perf`: predicted TTFT, TPOT and throughput of a layout under a load.

    python -m infra perf --model llama-3.1-70b --gpu H100-SXM-80GB --tp 8 --isl 1024 --osl 1024 --concurrency 1,4,16,64 [--json] [--chart curve.png]
    python -m infra perf --model deepseek-v4-pro --instance-type p5.48xlarge --nodes 4 --tp 8 --pp 4 --request-rate 2,4,8
    python -m infra perf --validate        (the model against tests/fixtures/perf/measurements.jsonl)
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infra.errors import UserError
from infra.planning.perf import predict, published_error, sharegpt, validate
from infra.planning.perf.hardware import hardware
from infra.planning.plan import dp_moe_warnings
from infra.planning.perf.scheduler import SimResult
from infra.planning.perf.workload import Workload
from infra.planning.request import KV_CACHE_DTYPES, SPECULATIVE_METHODS

REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = REPO / "tests" / "fixtures" / "perf"
PROMPTS_PER_CONCURRENCY = 10  # closed loop: 10 x C prompts, as the field's sweeps run (at least 100)
MIN_PROMPTS = 100


def _numbers(text: str | None, kind, what: str) -> list:
    if text is None:
        return []
    try:
        values = [kind(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{what} takes a number or a comma-separated list, got {text!r}") from None
    if not all(v > 0 for v in values):  # NaN too: vllm bench serve's rate is a positive number or inf
        raise UserError(f"{what} must be above 0, got {text!r}")
    return values


def _latency(lat) -> dict:
    return {"mean": lat.mean, "p50": lat.p50, "p90": lat.p90, "p99": lat.p99}


def _bound(s: predict.Setup, res: SimResult, isl: float, osl: float) -> dict:
    """What bounds the decode step at the run's mean batch (the step model's largest part
    on the slowest stage), and what stopped admission most often (the scheduler)."""
    batch = max(1, round(res.mean_batch_size))
    parts = s.step.parts([int(isl + osl / 2)] * batch, [], 1 + s.knobs.num_speculative_tokens)
    slowest = max(parts, key=lambda p: p.total_s)
    limits = {k: v for k, v in res.limits.items() if k != "none" and v > 0}
    admission = max(limits, key=limits.get) if limits else "none"
    binding = admission.replace("_", "-") if limits and limits[admission] >= 0.5 else slowest.bound
    return {"decode_step": slowest.bound, "admission": admission, "bound": binding}


def point_json(s: predict.Setup, res: SimResult, *, concurrency, rate, isl: float, osl: float) -> dict:
    gpus = s.gpus
    return {
        "concurrency": concurrency,
        "request_rate": rate,
        "ttft_ms": _latency(res.ttft_ms),
        "tpot_ms": _latency(res.tpot_ms),
        "itl_ms": _latency(res.itl_ms),
        "requests_per_s": res.requests_per_s,
        "output_tokens_per_s": res.output_tokens_per_s,
        "total_tokens_per_s": res.total_tokens_per_s,
        "output_tokens_per_s_per_gpu": res.output_tokens_per_s / gpus,
        "output_tokens_per_s_per_user": 1000.0 / res.tpot_ms.mean if res.tpot_ms.mean else None,
        "preemptions": res.preemptions,
        "mean_batch_size": res.mean_batch_size,
        "mean_step_ms": res.mean_step_s * 1000,
        "completed": res.completed,
        "duration_s": res.duration_s,
        **_bound(s, res, isl, osl),
    }


def _warnings(s: predict.Setup) -> list[str]:
    return dp_moe_warnings(s.arch, s.layout, s.hw.gpus_per_node, "--dp 1", efa=s.hw.network_bytes_per_s > 0)


def setup_json(s: predict.Setup) -> dict:
    k, lay = s.knobs, s.layout
    return {
        "model": s.arch.name,
        "gpu": s.hw.gpu.name,
        "instance_type": s.hw.instance,
        "gpus": s.gpus,
        "layout": {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp, "expert_parallel": lay.expert_parallel},
        "vllm": {"version": k.release.version, "max_num_seqs": k.max_num_seqs, "max_num_batched_tokens": k.max_num_batched_tokens,
                 "max_model_len": k.max_model_len, "async_scheduling": k.async_scheduling,
                 "num_speculative_tokens": k.num_speculative_tokens, "kv_cache_dtype": lay.kv_cache_dtype,
                 "tokenizer_mode": predict.tokenizer_mode(s), "chat_path": predict.chat_path(s)},  # fmt: skip
        "kv_blocks": s.pool.num_blocks,
        # What the figures leave out for this layout (the plan's warning of the same).
        "warnings": _warnings(s),
        "efficiency": {key: v for key, v in asdict(s.step.eff).items() if key != "fitted_on"},
        "hardware_source": s.hw.source,
    }


def _fail(message: str) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    raise typer.Exit(2)


def perf(
    model: Optional[str] = typer.Option(None, help="Catalog name, config.json, or model directory."),
    gpu: Optional[str] = typer.Option(None, help="A catalog GPU; the count is TP x PP x DP."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help="An EC2 instance type of the catalog (with --nodes)."),
    nodes: Optional[int] = typer.Option(None, help="Nodes of --instance-type (default: as many as TP x PP x DP needs)."),
    tp: int = typer.Option(1, help="Tensor parallel size."),
    pp: int = typer.Option(1, help="Pipeline parallel size."),
    dp: Optional[int] = typer.Option(None, help="Data parallel size (default: the GPUs left by TP x PP)."),
    expert_parallel: bool = typer.Option(False, "--expert-parallel/--no-expert-parallel"),
    isl: Optional[int] = typer.Option(None, help="Input tokens per request."),
    osl: Optional[int] = typer.Option(None, help="Output tokens per request."),
    workload: Optional[Path] = typer.Option(None, help='JSON lines of {"input_tokens": N, "output_tokens": M}.'),
    random_range_ratio: Optional[float] = typer.Option(None, "--random-range-ratio", help="Lengths uniform within ISL/OSL x (1 +- R), as vllm bench serve's random dataset."),
    length_spread: Optional[float] = typer.Option(None, "--length-spread", help="Lengths lognormal around ISL/OSL with std / mean S."),
    dataset: Optional[str] = typer.Option(None, "--dataset", help="sharegpt: ShareGPT's own lengths, as vllm bench serve --dataset-name sharegpt sends them (scaled to --isl/--osl if given)."),
    concurrency: Optional[str] = typer.Option(None, help="Closed loop at C requests in flight; a list (1,4,16,64) sweeps."),
    request_rate: Optional[str] = typer.Option(None, "--request-rate", help="Open loop, Poisson arrivals at R requests/s; a list sweeps."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help=f"Requests per point (default {PROMPTS_PER_CONCURRENCY} x C, at least {MIN_PROMPTS})."),
    max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs"),
    max_num_batched_tokens: Optional[int] = typer.Option(None, "--max-num-batched-tokens"),
    max_model_len: Optional[int] = typer.Option(None, "--max-model-len"),
    speculative_method: Optional[str] = typer.Option(None, "--speculative-method", help=f"One of: {', '.join(SPECULATIVE_METHODS)}."),
    num_speculative_tokens: Optional[int] = typer.Option(None, "--num-speculative-tokens"),
    acceptance_rate: float = typer.Option(predict.DEFAULT_MTP_ACCEPTANCE, "--acceptance-rate", help="Per drafted token (default: DeepSeek-V3 report's 85%)."),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help=f"One of: {', '.join(KV_CACHE_DTYPES)}."),
    vllm_version: Optional[str] = typer.Option(None, "--vllm-version"),
    tokenizer_mode: Optional[str] = typer.Option(None, "--tokenizer-mode", help="As vllm serve's (default: the stack's own for the model, else auto); it sets the API server's chat path."),
    sla_ttft_ms: Optional[float] = typer.Option(None, "--sla-ttft-ms", help="Drawn on the chart."),
    sla_tpot_ms: Optional[float] = typer.Option(None, "--sla-tpot-ms", help="Drawn on the chart."),
    seed: int = typer.Option(0, help="Seed of the lengths and arrivals."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
    chart: Optional[Path] = typer.Option(None, help="Draw output tokens/s per GPU against tokens/s per user to FILE (.png or .svg)."),
    do_validate: bool = typer.Option(False, "--validate", help="Predict every published measurement in tests/fixtures/perf/ and print the errors."),
    do_fit: bool = typer.Option(False, "--fit", help="Re-fit the fitted fractions on the fit rows and print them."),
    write_summary: bool = typer.Option(False, "--write-summary", help="With --validate: keep its medians where the plan reads them (infra/planning/perf/data/validation_summary.json)."),
    compare_aiconfigurator: bool = typer.Option(False, "--compare-aiconfigurator", help="Put NVIDIA AIConfigurator's estimate beside each point (installs venv-perf/ on first use)."),
) -> None:
    """Predict TTFT, TPOT and throughput of vLLM serving for a layout and a load, offline."""
    console = Console()
    if write_summary and (do_fit or not do_validate):
        _fail("--write-summary goes with --validate alone: the plan quotes the errors of the figures in fitted.py, not of a refit")
    if do_validate or do_fit:
        _validate(console, fit_first=do_fit, as_json=as_json, write_summary=write_summary)
        return
    try:
        if not model:
            raise UserError("give --model (or --validate)")
        for flag, value in (("--nodes", nodes), ("--num-prompts", num_prompts), ("--tp", tp), ("--pp", pp), ("--dp", dp)):
            if value is not None and value < 1:
                raise UserError(f"{flag} must be at least 1, got {value}")
        hw = hardware(gpu=gpu, instance_type=instance_type)
        per_node = hw.gpus_per_node
        total = (nodes * per_node) if nodes else None
        if dp is None:
            dp = total // (tp * pp) if total and total % (tp * pp) == 0 else 1
        if total is not None and tp * pp * dp != total:
            raise UserError(f"TP {tp} x PP {pp} x DP {dp} = {tp * pp * dp} GPUs, but {nodes} x {instance_type} have {total}")
        if speculative_method is not None and speculative_method not in SPECULATIVE_METHODS:
            raise UserError(f"speculative method {speculative_method!r} is not one of: {', '.join(SPECULATIVE_METHODS)}")
        if num_speculative_tokens and not speculative_method:
            raise UserError("--num-speculative-tokens needs --speculative-method mtp")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise UserError(f"--kv-cache-dtype {kv_cache_dtype!r} is not one of: {', '.join(KV_CACHE_DTYPES)}")
        for flag, ms in (("--sla-ttft-ms", sla_ttft_ms), ("--sla-tpot-ms", sla_tpot_ms)):
            if ms is not None and not 0 < ms < math.inf:
                raise UserError(f"{flag} must be a number of milliseconds above 0, got {ms}")
        if not 0 <= acceptance_rate <= 1:
            raise UserError(f"--acceptance-rate must be between 0 and 1, got {acceptance_rate}")
        concurrencies = _numbers(concurrency, int, "--concurrency")
        rates = _numbers(request_rate, float, "--request-rate")
        if bool(concurrencies) == bool(rates):
            raise UserError("give one of --concurrency C[,C...] or --request-rate R[,R...]")
        if dataset is not None:
            if dataset != "sharegpt":
                raise UserError(f"--dataset {dataset!r} is not one of: sharegpt")
            if workload is not None or random_range_ratio is not None or length_spread is not None:
                raise UserError("--dataset sharegpt draws its own lengths: give no --workload, --random-range-ratio or --length-spread")
            if bool(isl) != bool(osl) or (isl is not None and isl < 1) or (osl is not None and osl < 1):
                raise UserError("with --dataset sharegpt give both --isl and --osl (the means to scale to, at least 1 each) or neither")
            means = (isl, osl) if isl else sharegpt.means()
            load = Workload.sharegpt(*means)
        elif workload is not None:
            if isl or osl or random_range_ratio is not None or length_spread is not None:
                raise UserError("give --workload FILE or --isl and --osl (with a spread), not both")
            load = Workload.from_jsonl(str(workload))
        else:
            if not (isl and osl) or isl < 1 or osl < 1:
                raise UserError("give --isl and --osl (tokens, at least 1 each), or --workload FILE")
            if random_range_ratio is not None and length_spread is not None:
                raise UserError("give --random-range-ratio or --length-spread, not both")
            if random_range_ratio is not None:
                load = Workload.uniform(isl, osl, random_range_ratio)
            elif length_spread is not None:
                load = Workload.lognormal(isl, osl, length_spread)
            else:
                load = Workload.fixed(isl, osl)
        from infra.catalog.models import load_model

        arch = load_model(model)
        srv = predict.Serving(
            tp=tp, pp=pp, dp=dp, expert_parallel=expert_parallel, kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len, max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
            num_speculative_tokens=(num_speculative_tokens or 1) if speculative_method else 0,
            acceptance_rate=acceptance_rate, vllm_version=vllm_version, tokenizer_mode=tokenizer_mode,
        )  # fmt: skip
        s = predict.setup(arch, hw, srv)
        lengths = load.sample(200, seed)
        longest = max(i + o for i, o in lengths)
        if longest > s.knobs.max_model_len:
            raise UserError(f"ISL + OSL = {longest:,} tokens is above max-model-len {s.knobs.max_model_len:,}")
        mean_isl = sum(i for i, _ in lengths) / len(lengths)
        mean_osl = sum(o for _, o in lengths) / len(lengths)
        if chart is not None and chart.suffix.lower() not in (".png", ".svg"):
            raise UserError(f"--chart takes a .png or .svg file, got {chart.name!r}")
        points = []
        for c, r in [(c, None) for c in concurrencies] + [(None, r) for r in rates]:
            n = num_prompts or max(MIN_PROMPTS, PROMPTS_PER_CONCURRENCY * (c or 1))
            res = predict.run(s, load, concurrency=c, request_rate=r, num_prompts=n, seed=seed)
            points.append(point_json(s, res, concurrency=c, rate=r, isl=mean_isl, osl=mean_osl))
    except UserError as err:
        _fail(str(err))
    compared = None
    if compare_aiconfigurator:
        compared = _aiconfigurator(arch, s, concurrencies, mean_isl, mean_osl)
    if chart is not None:
        from infra.cli.perf_plot import draw_curve

        try:
            draw_curve(points, chart, title=f"{arch.name} on {s.gpus} x {hw.gpu.name}", sla_tpot_ms=sla_tpot_ms)
        except OSError as err:
            _fail(f"cannot write --chart {chart}: {err.strerror or err}")
    if as_json:
        out = {"setup": setup_json(s), "points": points}
        if compared is not None:
            out["aiconfigurator"] = compared
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
        return
    _render(console, s, points, compared, sla_ttft_ms, sla_tpot_ms)
    for w in _warnings(s):
        console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if chart is not None:
        console.print(f"chart written to {escape(str(chart))}", soft_wrap=True)  # a path the user copies: never broken across lines


def _aiconfigurator(arch, s: predict.Setup, concurrencies: list[int], isl: float, osl: float) -> list[dict]:
    from infra.cli import aiconfigurator

    from infra.catalog.models import CATALOG

    entry = CATALOG.get(arch.name)
    request = {
        "model": entry.hf_repo if entry else arch.name, "gpu": s.hw.gpu.name, "tp": s.layout.tp, "pp": s.layout.pp,
        "dp": s.layout.dp, "expert_parallel": s.layout.expert_parallel, "isl": round(isl), "osl": round(osl),
        "concurrencies": concurrencies, "weights": arch.weight_format,
    }  # fmt: skip
    try:
        return aiconfigurator.compare(request, root=REPO)
    except UserError as err:
        return [{"concurrency": c, "covered": False, "reason": str(err)} for c in concurrencies]


def _ms(lat: dict) -> str:
    return f"{lat['p50']:,.1f} / {lat['p99']:,.1f}"


def _render(console: Console, s: predict.Setup, points: list[dict], compared, sla_ttft_ms, sla_tpot_ms) -> None:
    lay, k = s.layout, s.knobs
    title = (f"{escape(s.arch.name)} on {s.gpus} x {s.hw.gpu.name}: TP {lay.tp} x PP {lay.pp} x DP {lay.dp}"
             f"{', expert parallel' if lay.expert_parallel else ''}; vLLM {k.release.version}, max-num-seqs {k.max_num_seqs}, "
             f"max-num-batched-tokens {k.max_num_batched_tokens:,}")  # fmt: skip
    t = Table(title=title, title_justify="left", title_style="bold")
    for col in ("load", "TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50/p99 ms", "req/s", "out tok/s", "out tok/s/GPU",
                "tok/s/user", "batch", "preempt", "bound"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("load", "bound") else "right")
    by_c = {c["concurrency"]: c for c in compared or []}
    for p in points:
        load = f"C={p['concurrency']}" if p["concurrency"] else f"{p['request_rate']:g} req/s"
        t.add_row(load, _ms(p["ttft_ms"]), _ms(p["tpot_ms"]), _ms(p["itl_ms"]), f"{p['requests_per_s']:,.2f}",
                  f"{p['output_tokens_per_s']:,.0f}", f"{p['output_tokens_per_s_per_gpu']:,.1f}",
                  f"{p['output_tokens_per_s_per_user'] or 0:,.1f}", f"{p['mean_batch_size']:,.1f}", str(p["preemptions"]),
                  p["bound"])  # fmt: skip
    console.print(t)
    if sla_ttft_ms or sla_tpot_ms:
        for p in points:
            ok = (not sla_ttft_ms or p["ttft_ms"]["p99"] <= sla_ttft_ms) and (not sla_tpot_ms or p["tpot_ms"]["p99"] <= sla_tpot_ms)
            load = f"C={p['concurrency']}" if p["concurrency"] else f"{p['request_rate']:g} req/s"
            console.print(f"{load}: SLA {'[green]met[/green]' if ok else '[red]missed[/red]'} (p99 TTFT and TPOT)")
    if compared:
        t = Table(title="NVIDIA AIConfigurator beside it (its kernel database; same layout and lengths)", title_justify="left", title_style="bold")
        for col in ("C", "ours TTFT / TPOT ms", "AIC TTFT / TPOT ms", "ours / AIC tok/s/GPU", "note"):
            t.add_column(col)
        ours = {p["concurrency"]: p for p in points}
        for c in compared:
            p = ours.get(c.get("concurrency"))
            if not p:
                continue
            mine = f"{p['ttft_ms']['mean']:,.1f} / {p['tpot_ms']['mean']:,.1f}"
            if c.get("covered"):
                t.add_row(str(c["concurrency"]), mine, f"{c['ttft_ms']:,.1f} / {c['tpot_ms']:,.1f}",
                          f"{p['output_tokens_per_s_per_gpu']:,.1f} / {c['output_tokens_per_s_per_gpu']:,.1f}",
                          escape(f"{c.get('backend', '')} {c.get('backend_version', '')} on {c.get('system', '')}"))  # fmt: skip
            else:
                t.add_row(str(c["concurrency"]), mine, "-", "-", escape(f"not covered: {c.get('reason', '')}"))
        console.print(t)


def _validate(console: Console, *, fit_first: bool, as_json: bool, write_summary: bool = False) -> None:
    try:
        rows = validate.load_rows(MEASUREMENTS / "measurements.jsonl")
        eff = validate.DEFAULT
        if fit_first:
            eff = validate.fit(rows, MEASUREMENTS, log=lambda m: Console(stderr=True).print(escape(m)))
            console.print(f"fitted on {len(eff.fitted_on)} rows: {validate.efficiency_source(eff)}")
        points = validate.predict_rows(rows, MEASUREMENTS, eff)
    except UserError as err:
        _fail(str(err))
    summary = validate.summary(points, rows)
    if write_summary:
        published_error.write(summary)
        Console(stderr=True).print(f"wrote {published_error.SUMMARY.relative_to(REPO)}")
    if as_json:
        sys.stdout.write(json.dumps({"points": [asdict(p) for p in points], "summary": summary}, indent=2) + "\n")
        return
    t = Table(title="Predicted / measured (means, as vllm bench serve prints them)", title_justify="left", title_style="bold")
    for col in ("row", "role", "TTFT ms", "err", "TPOT ms", "err", "out tok/s", "err"):
        t.add_column(col, justify="left" if col in ("row", "role") else "right")
    for p in points:
        cells = []
        for k in validate.METRICS:
            e = p.error(k)
            cells += [f"{p.predicted[k]:,.1f} / {p.measured[k]:,.1f}" if p.measured.get(k) and p.predicted.get(k) else "-",
                      f"{100 * e:+.0f}%" if e is not None else "-"]  # fmt: skip
        t.add_row(escape(p.id), p.role, *cells)
    console.print(t)
    for p in points:
        if p.refused:
            console.print(f"[yellow]not predicted:[/yellow] {escape(p.id)}: {escape(p.refused)}", soft_wrap=True)
    families = sorted(role for role in summary if role.startswith(published_error.FAMILY))
    for role in ("fit", "validate", "validate_bounded", "validate_burst", *families):
        s = summary[role]
        console.print(
            f"{role} ({s['points']} rows): median |error| "
            + ", ".join(f"{k} {100 * s['median_abs_error'][k]:.0f}% (worst x{s['worst_ratio'][k]:.2f})" for k in validate.METRICS)
        )
    verdicts = validate.target_verdicts(summary)
    met = [phrase for phrase, ok in verdicts if ok]
    missed = [phrase for phrase, ok in verdicts if not ok]
    if met:
        console.print("[green]targets met[/green] on the validation rows: " + ", ".join(met))
    if missed:
        console.print("[red]targets missed[/red] on the validation rows: " + ", ".join(missed))
