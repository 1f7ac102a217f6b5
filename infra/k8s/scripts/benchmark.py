"""The serving benchmark's Job (infra/k8s/checks.py): wait for the endpoint, run the benchmark, judge its result.

    python3 benchmark.py --health-url URL --timeout-s S --result FILE \\
        --ttft-p99-ms X --tpot-p99-ms Y --requests N [--predicted JSON] [--summary PATH] -- vllm bench serve ...

Waits (at most S seconds) until URL answers 200, runs the command after `--`
(`vllm bench serve ... --save-result`, which writes FILE), prints the measured
figures beside the plan's prediction for the same load (`--predicted`, result
keys to values), and exits 1 when the result misses a threshold
(`check_benchmark_result`; the prediction never decides); a failed command's
exit status is the Job's. The outcome, measured and predicted side by side, goes
to PATH as one JSON object (`summary`): the Job points it at the container's
termination message, which Kubernetes keeps in the pod's status for
`python -m infra benchmark-report` to read back; it is also the log's last line.
Standard library only.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

POLL_S = 10
# The API key's file (the Job mounts the stack's Secret) and the variable `vllm bench serve` sends as
# `Authorization: Bearer` (vLLM 0.34.0 vllm/benchmarks/lib/endpoint_request_func.py, _get_headers).
KEY_FILE_ENV = "GPU_SERVING_API_KEY_FILE"
BENCH_KEY_ENV = "OPENAI_API_KEY"


def command_env(environ):
    """The benchmark command's environment: the caller's, plus the API key read from its file when one is given."""
    env = dict(environ)
    path = env.get(KEY_FILE_ENV)
    if path:
        with open(path) as f:
            env[BENCH_KEY_ENV] = f.read().strip()
    return env


def check_benchmark_result(result, ttft_p99_ms, tpot_p99_ms, expected_requests):
    """Why a `vllm bench serve --save-result` result misses its thresholds (empty: it passed).

    Field names as vllm/benchmarks/serve.py writes them: `completed`, and for
    `--percentile-metrics ttft,tpot --metric-percentiles 99` the keys
    `p99_ttft_ms` and `p99_tpot_ms` (`f"p{p}_{metric}_ms"`). Thresholds are
    strict: a p99 equal to its threshold fails.
    """
    problems = []
    completed = result.get("completed")
    if not isinstance(completed, (int, float)):
        problems.append("the result has no 'completed' count")
    elif completed < expected_requests:
        problems.append(f"{expected_requests - int(completed)} of {expected_requests} requests failed")
    for key, limit, label in (("p99_ttft_ms", ttft_p99_ms, "TTFT"), ("p99_tpot_ms", tpot_p99_ms, "TPOT")):
        value = result.get(key)
        if not isinstance(value, (int, float)) or value != value:
            problems.append(f"the result has no {key} (run with --percentile-metrics ttft,tpot --metric-percentiles 99)")
        elif not value < limit:
            problems.append(f"p99 {label} {value:.1f} ms is not below {limit:g} ms")
    return problems


def wait_healthy(url, timeout_s):
    """True once `url` answers 200; False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return True
        except Exception as exc:
            print("waiting for the endpoint:", exc, flush=True)
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


def comparison(result, predicted):
    """Lines of `metric  predicted  measured  measured/predicted` for each predicted key."""
    lines = [f"{'metric':<22} {'predicted':>12} {'measured':>12} {'measured/predicted':>20}"]
    for key in sorted(predicted):
        want, got = predicted[key], result.get(key)
        measured = f"{got:12.2f}" if isinstance(got, (int, float)) else f"{'-':>12}"
        ratio = f"{got / want:20.2f}" if isinstance(got, (int, float)) and want else f"{'-':>20}"
        lines.append(f"{key:<22} {want:12.2f} {measured} {ratio}")
    return lines


# The log line that carries the summary (benchmark-report finds it in `kubectl logs` too).
SUMMARY_PREFIX = "benchmark summary: "
# Kubernetes keeps at most 4,096 bytes of a termination message.
SUMMARY_MAX_BYTES = 4096


def summary(result, predicted, ttft_p99_ms, tpot_p99_ms, problems):
    """The outcome in one small JSON object: each predicted key's measurement (None when the
    result lacks it), the prediction, the thresholds, and what failed (empty: passed)."""
    keys = sorted(set(predicted) | {"completed", "p99_ttft_ms", "p99_tpot_ms"})
    measured = {k: result.get(k) if isinstance(result.get(k), (int, float)) else None for k in keys}
    return {
        "measured": measured,
        "predicted": dict(predicted),
        "sla": {"ttft_p99_ms": ttft_p99_ms, "tpot_p99_ms": tpot_p99_ms},
        "problems": list(problems),
        "passed": not problems,
    }


def write_summary(path, outcome):
    text = json.dumps(outcome, sort_keys=True, separators=(",", ":"))
    print(SUMMARY_PREFIX + text, flush=True)
    if path:
        if len(text.encode()) > SUMMARY_MAX_BYTES:  # keep the verdict; drop the figures
            text = json.dumps({k: outcome[k] for k in ("sla", "problems", "passed")}, sort_keys=True)
        with open(path, "w") as f:
            f.write(text)


def verdict(result_path, ttft_p99_ms, tpot_p99_ms, expected_requests, predicted=None, summary_path=None):
    with open(result_path) as f:
        result = json.load(f)
    if predicted:
        print("measured against the plan's prediction for this load:")
        for line in comparison(result, predicted):
            print(line)
    problems = check_benchmark_result(result, ttft_p99_ms, tpot_p99_ms, expected_requests)
    print(
        f"p99 TTFT {result.get('p99_ttft_ms')} ms (< {ttft_p99_ms:g}), "
        f"p99 TPOT {result.get('p99_tpot_ms')} ms (< {tpot_p99_ms:g})"
    )
    for p in problems:
        print("BENCHMARK FAILED:", p, file=sys.stderr)
    write_summary(summary_path, summary(result, predicted or {}, ttft_p99_ms, tpot_p99_ms, problems))
    return 1 if problems else 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        sys.exit("benchmark.py: give the benchmark command after --")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    parser = argparse.ArgumentParser(description="Run the serving benchmark and judge it.")
    parser.add_argument("--health-url", required=True)
    parser.add_argument("--timeout-s", type=int, required=True, help="how long the endpoint may take to become healthy")
    parser.add_argument("--result", required=True, help="the result file the command writes")
    parser.add_argument("--ttft-p99-ms", type=float, required=True)
    parser.add_argument("--tpot-p99-ms", type=float, required=True)
    parser.add_argument("--requests", type=int, required=True, help="requests the command sends; all must complete")
    parser.add_argument("--predicted", type=json.loads, default={}, help="result key -> the plan's predicted value")
    parser.add_argument("--summary", default=None, help="where to write the outcome as JSON (the termination message)")
    args = parser.parse_args(options)
    if not command:
        parser.error("no benchmark command after --")

    def failed(problem):
        print("BENCHMARK FAILED:", problem, file=sys.stderr)
        write_summary(args.summary, summary({}, args.predicted, args.ttft_p99_ms, args.tpot_p99_ms, [problem]))

    if not wait_healthy(args.health_url, args.timeout_s):
        failed("the endpoint did not become healthy")
        return 1
    done = subprocess.run(command, env=command_env(os.environ))
    if done.returncode != 0:
        failed(f"{command[0]} exited with {done.returncode}")
        return done.returncode if done.returncode > 0 else 1
    return verdict(args.result, args.ttft_p99_ms, args.tpot_p99_ms, args.requests, args.predicted, args.summary)


if __name__ == "__main__":
    sys.exit(main())
