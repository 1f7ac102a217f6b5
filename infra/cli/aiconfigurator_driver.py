"""Runs NVIDIA AIConfigurator for `infra.cli.aiconfigurator`: a JSON request on stdin, JSON on stdout.

Run only with venv-perf/bin/python (requirements-perf.txt): it imports aiconfigurator,
which the stack itself never does. Standard library, aiconfigurator and its PyYAML only; nothing
from `infra`.

Request (built by `infra.cli.aiconfigurator.driver_request`):

    {"model": "meta-llama/Meta-Llama-3.1-70B", "system": "h100_sxm", "backend": "vllm",
     "backend_version": null, "tp": 8, "pp": 1, "dp": 1, "moe_tp": 8, "moe_ep": 1,
     "isl": 1024, "osl": 1024, "quant": {"gemm_quant_mode": "fp8", ...},
     "points": [{"concurrency": 16, "batch_size": 16}, ...]}

Answer: {"aiconfigurator_version": "0.12.0", "points": [{"concurrency", "covered", "reason",
"ttft_ms", "tpot_ms", ...}, ...]}, one entry per request point, in order. A case the
package's data does not cover is an entry with covered false and the reason; only a
malformed request makes the driver exit non-zero.

Offline: aiconfigurator downloads config.json from Hugging Face for a model outside
its built-in list (aiconfigurator_core/sdk/utils.py, `_load_model_config_from_model_path`,
`DefaultHFModels` in aiconfigurator_core/sdk/common.py). The driver never lets it: a
model on that list is passed by name, one whose config.json the wheel ships anyway
(aiconfigurator_core/model_configs/<org>--<repo>_config.json) as a local directory
holding that file, and any other model is reported as not covered.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import sys
import tempfile
from collections import Counter
from importlib import metadata, resources
from pathlib import Path

# Run as a script, this file's folder leads sys.path, and its sibling aiconfigurator.py
# (the CLI layer) would shadow the package of that name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]


def _package_files(*parts: str) -> Path:
    return Path(str(resources.files("aiconfigurator_core").joinpath(*parts)))


def database_version(system: str, backend: str) -> str | None:
    # aiconfigurator_core/sdk/perf_database.py: the version `cli_estimate` picks when none is given.
    from aiconfigurator.sdk.perf_database import get_latest_database_version

    return get_latest_database_version(system=system, backend=backend)


def resolve_model(model: str, scratch: Path) -> tuple[str | None, str]:
    """(the model_path to give aiconfigurator, a note), or (None, why it is not covered)."""
    from aiconfigurator_core.sdk.common import DefaultHFModels

    if model in DefaultHFModels:
        return model, ""
    stem = model.replace("/", "--")
    config = _package_files("model_configs", f"{stem}_config.json")
    if not config.is_file():
        return None, (f"model not supported: aiconfigurator ships no config.json for {model} "
                      "(it would download one from Hugging Face; not attempted)")
    local = scratch / stem
    local.mkdir()
    shutil.copyfile(config, local / "config.json")
    quant = _package_files("model_configs", f"{stem}_hf_quant_config.json")
    if quant.is_file():
        shutil.copyfile(quant, local / "hf_quant_config.json")
    return str(local), f"{model} is not on aiconfigurator's model list; estimated from the config.json its wheel ships"


def support_matrix(model: str, system: str, backend: str, version: str) -> str:
    """What the wheel's own support matrix (aiconfigurator_core/systems/support_matrix/<system>.csv) says of this agg case."""
    import csv

    path = _package_files("systems", "support_matrix", f"{system}.csv")
    if not path.is_file():
        return ""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if (row["HuggingFaceID"], row["Backend"], row["Version"], row["Mode"]) == (model, backend, version, "agg"):
                last = (row.get("ErrMsg") or "").strip().splitlines()
                return row["Status"] + (f": {last[-1].strip()}" if last else "")
    return ""


def _reason(exc: Exception) -> str:
    name = type(exc).__name__
    text = " ".join(str(exc).split())
    if name == "PerfDataNotAvailableError":  # aiconfigurator_core/sdk/errors.py
        return f"database does not cover it: {text}"
    if text.startswith("OOM"):  # aiconfigurator/cli/api.py `_run_agg_estimate`
        return f"does not fit in GPU memory by aiconfigurator's estimate: {text}"
    return f"{name}: {text}"


def estimate(req: dict, model_path: str, is_moe: bool, point: dict) -> dict:
    """One aggregated (IFB) point through `cli_estimate` (aiconfigurator/cli/api.py)."""
    from aiconfigurator.cli.api import cli_estimate

    moe = {"moe_tp_size": req["moe_tp"], "moe_ep_size": req["moe_ep"]} if is_moe else {}
    r = cli_estimate(
        model_path, req["system"], mode="agg", backend_name=req["backend"],
        backend_version=req.get("backend_version"), database_mode="SILICON",
        isl=req["isl"], osl=req["osl"], batch_size=point["batch_size"],
        tp_size=req["tp"], pp_size=req["pp"], attention_dp_size=req["dp"],
        **moe, **req.get("quant", {}),
    )
    raw = r.raw
    sources = Counter(v for step in (r.per_ops_source or {}).values() for v in step.values())
    return {
        "covered": True,
        "reason": "",
        "ttft_ms": float(r.ttft),
        "tpot_ms": float(r.tpot),
        "request_latency_ms": float(r.request_latency),
        "output_tokens_per_s_per_gpu": float(r.tokens_per_second_per_gpu),
        "output_tokens_per_s_per_user": float(r.tokens_per_second_per_user),
        "aic_concurrency": int(r.concurrency),  # batch_size x pp x attention dp (aiconfigurator_core/sdk/backends/base_backend.py)
        "gpus": int(r.num_total_gpus),
        "parallel": raw.get("parallel"),
        "quant": {k: raw.get(k) for k in ("gemm", "moe", "kvcache", "fmha", "comm")},
        "memory_gib": float(raw.get("memory", 0.0)),  # aiconfigurator's per-GPU memory estimate
        "op_sources": dict(sources),  # silicon (measured table) / empirical / sol / mixed, per op
        "warning": r.kv_cache_warning or "",
        "backend_version": r.backend_version,
    }


def run(req: dict) -> dict:
    for key in ("model", "system", "backend", "tp", "pp", "dp", "moe_tp", "moe_ep", "isl", "osl", "points"):
        if key not in req:
            raise ValueError(f"request has no {key!r}")
    system, backend = req["system"], req["backend"]
    version = req.get("backend_version")
    reason, note, points = "", "", []
    if not _package_files("systems", f"{system}.yaml").is_file():
        reason = f"aiconfigurator has no system {system}"
    else:
        version = version or database_version(system, backend)
        if version is None:
            reason = f"no {backend} database for {system} in aiconfigurator"
    with tempfile.TemporaryDirectory(prefix="aic-") as scratch:
        model_path = None
        if not reason:
            model_path, note = resolve_model(req["model"], Path(scratch))
            if model_path is None:
                reason, note = note, ""
        is_moe = False
        if not reason:
            from aiconfigurator_core.sdk.models.helpers import check_is_moe

            is_moe = check_is_moe(model_path)
        matrix = support_matrix(req["model"], system, backend, version) if version else ""
        for point in req["points"]:
            out = {"concurrency": point["concurrency"], "batch_size": point["batch_size"], "covered": False,
                   "reason": reason, "system": system, "backend": backend, "backend_version": version,
                   "support_matrix": matrix, "note": note}
            if not reason:
                try:
                    out.update(estimate(req, model_path, is_moe, point))
                except Exception as exc:  # noqa: BLE001 - every failure of the package is a case it does not cover
                    out["reason"] = _reason(exc)
            points.append(out)
    return {"aiconfigurator_version": metadata.version("aiconfigurator"), "points": points}


def parse_yaml_in_c() -> bool:
    """Give aiconfigurator's `yaml.safe_load` calls libyaml's parser, when PyYAML has it.

    aiconfigurator reads its database's metadata (about 1,200 YAML files a call, several of
    them more than once: aiconfigurator_core/sdk/perf_database.py get_supported_databases,
    _load_collection_meta_yaml) with yaml.safe_load, PyYAML's pure-Python scanner and parser:
    20 of the 22 s an estimate of two points took. CSafeLoader is the same loader (SafeLoader's
    constructor and resolver) over libyaml's scanner and parser, which the PyYAML wheels of
    requirements-perf.txt carry. Every call site looks the function up on the module, so
    replacing it before aiconfigurator runs reaches them all."""
    import yaml

    if not getattr(yaml, "__with_libyaml__", False):
        return False

    def safe_load(stream):
        return yaml.load(stream, Loader=yaml.CSafeLoader)

    yaml.safe_load = safe_load
    return True


def main() -> int:
    req = json.loads(sys.stdin.read())
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    parse_yaml_in_c()
    # aiconfigurator prints progress on stdout: keep stdout for the answer alone.
    with contextlib.redirect_stdout(sys.stderr):
        answer = run(req)
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
