"""CPU cost per engine step of vLLM 0.34.0's `--enable-mfu-metrics` (infra/planning/serving.py cites it).

Times the wheel's own code, taken from v1/metrics/perf.py by ast (vLLM is not imported):
`ExecutionContext` and the request loop of `ModelMetrics.get_step_perf_stats_per_gpu`, on a
synthetic scheduler output (2 new requests of 220 tokens, the rest decoding); and the three
extra passes a model with sliding-window layers makes. The per-component sums after the loop
are a fixed number of integer operations per step and are left out.

    venv/bin/pip download --no-deps vllm==0.34.0 -d /tmp/w && unzip -q -o /tmp/w/vllm-0.34.0-*.whl 'vllm/*' -d /tmp/vllmsrc
    venv/bin/python benchmarks/mfu_step_cost.py /tmp/vllmsrc/vllm/v1/metrics/perf.py
"""

from __future__ import annotations

import ast
import sys
import time
import types
from dataclasses import dataclass, field


def load(path: str):
    tree = ast.parse(open(path).read())
    ns: dict = {"dataclass": dataclass, "field": field}
    body = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "ExecutionContext":
            exec(compile(ast.Module([node], []), path, "exec"), ns)
        if isinstance(node, ast.ClassDef) and node.name == "ModelMetrics":
            body = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "get_step_perf_stats_per_gpu")
    stmts = body.body
    named = lambda s, n: isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == n  # noqa: E731
    start = next(i for i, s in enumerate(stmts) if named(s, "ctx"))
    end = next(i for i, s in enumerate(stmts) if named(s, "num_flops_breakdown"))
    args = ast.arguments(posonlyargs=[], args=[ast.arg("scheduler_output")], kwonlyargs=[], kw_defaults=[], defaults=[])
    fn = ast.FunctionDef(name="loop", args=args, body=stmts[start:end] + [ast.Return(ast.Name("ctx", ast.Load()))],
                         decorator_list=[], returns=None, type_params=[])  # fmt: skip
    exec(compile(ast.fix_missing_locations(ast.Module([fn], [])), path, "exec"), ns)
    return ns["loop"]


def scheduler_output(batch: int, new: int = 2, draft: int = 0):
    out = types.SimpleNamespace()
    out.scheduled_new_reqs = [types.SimpleNamespace(req_id=f"n{i}", num_computed_tokens=0) for i in range(new)]
    out.scheduled_cached_reqs = types.SimpleNamespace(req_ids=[f"c{i}" for i in range(batch - new)],
                                                      num_computed_tokens=[300 + i for i in range(batch - new)])  # fmt: skip
    out.num_scheduled_tokens = {**{f"n{i}": 220 for i in range(new)}, **{f"c{i}": 1 + draft for i in range(batch - new)}}
    return out


def main(path: str) -> None:
    loop = load(path)
    for batch in (16, 64, 256, 512):
        so, n = scheduler_output(batch), 2000
        t = time.perf_counter()
        for _ in range(n):
            ctx = loop(so)
        dt = (time.perf_counter() - t) / n
        t = time.perf_counter()
        for _ in range(n):
            ctx.total_token_context_product(128), ctx.prefill_context_len_for_window(128), ctx.decode_context_len_for_window(128)
        sw = (time.perf_counter() - t) / n
        print(f"{batch:4d} requests: loop {dt * 1e6:6.1f} us ({dt / batch * 1e9:4.0f} ns/request); sliding-window passes {sw * 1e6:6.1f} us")


if __name__ == "__main__":
    main(sys.argv[1])
