"""The inference API's key: made by the stack, a secret end to end, read by vLLM under the name the pinned
release reads, checked by the guard on every path but the probes, and sent by the benchmark.

The guard (infra/k8s/scripts/api_guard.py) is driven as vLLM's server drives an ASGI middleware; what
vLLM's own key check leaves open is read from the pinned release's source (the paths are in the
module doc of api_guard.py, from vLLM 0.34.0's authenticate.py GUARDED_PREFIX and its routers).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json

import pytest
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret

from components.serving import API_KEY_LENGTH
from infra.catalog.vllm import load_reference
from infra.k8s import checks, raycluster, script_files, serving_spec
from tests.test_serving import JOB, RC, SECRET, run, spec
from tests.synthesized import repo_stack

KEY = "k" * 48


def guard_class():
    path = script_files.SCRIPTS_DIR / serving_spec.API_GUARD_SCRIPT
    module_spec = importlib.util.spec_from_file_location("api_guard", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.ApiKeyGuard


def request(path: str, token: str | None = None, method: str = "POST", kind: str = "http") -> tuple[int | None, bool]:
    """(status sent by the guard or None, whether the app behind it was called)."""
    called, sent = [], []

    async def app(scope, receive, send):  # noqa: ANN001
        called.append(scope["path"])

    async def send(message):  # noqa: ANN001
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    headers = [(b"content-type", b"application/json")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    scope = {"type": kind, "method": method, "path": path, "root_path": "", "headers": headers}
    loop = asyncio.new_event_loop()  # its own loop: the Pulumi tests in this process keep theirs
    try:
        loop.run_until_complete(guard_class()(app)(scope, receive, send))
    finally:
        loop.close()
    status = next((m.get("status") for m in sent if m["type"] == "http.response.start"), None)
    if any(m["type"] == "websocket.close" for m in sent):
        status = 1008
    return status, bool(called)


@pytest.fixture()
def keyed(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", KEY)


# Paths vLLM 0.34.0's own key check does not guard (not under /v1, /v2, /inference, /cohere) but that serve
# or change something: SageMaker's generation route, elastic EP scaling, tokenizers, pooling.
UNGUARDED_BY_VLLM = ["/invocations", "/scale_elastic_ep", "/tokenize", "/detokenize", "/pooling", "/score", "/rerank"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", *UNGUARDED_BY_VLLM])
def test_every_serving_path_needs_the_key(keyed, path):
    assert request(path) == (401, False)
    assert request(path, token="wrong") == (401, False)
    assert request(path, token=KEY) == (None, True)


@pytest.mark.parametrize("path", ["/health", "/ping", "/metrics", "/version"])
def test_the_probes_and_metrics_need_none(keyed, path):
    assert request(path, method="GET") == (None, True)


def test_a_websocket_without_the_key_is_closed_and_preflight_passes(keyed):
    assert request("/v1/realtime", kind="websocket") == (1008, False)
    assert request("/v1/chat/completions", method="OPTIONS") == (None, True)


def test_without_a_key_the_server_does_not_start(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    with pytest.raises(RuntimeError, match="VLLM_API_KEY"):
        guard_class()(lambda *a: None)


def test_the_names_are_the_pinned_releases():
    """VLLM_API_KEY is an environment variable the release's envs.py declares (read from the wheel into the
    flag reference); --middleware is one of its flags and takes a repeatable import path."""
    s = spec()
    ref = load_reference(s.vllm_version)
    assert serving_spec.API_KEY_ENV in ref["registries"]["environment_variables"]
    assert ref["flags"]["--middleware"]["repeatable"] is True
    argv = s.serve_argv
    assert argv[argv.index("--middleware") + 1] == serving_spec.API_GUARD_MIDDLEWARE
    module, cls = serving_spec.API_GUARD_MIDDLEWARE.rsplit(".", 1)
    assert f"{module}.py" == serving_spec.API_GUARD_SCRIPT and guard_class().__name__ == cls
    # ray_head.sh puts its own folder (the scripts' mount) on PYTHONPATH before it runs the command.
    head = (script_files.SCRIPTS_DIR / serving_spec.HEAD_SCRIPT).read_text()
    assert 'export PYTHONPATH="$here' in head.split("exec \"$@\"")[0]
    assert serving_spec.API_GUARD_SCRIPT in serving_spec.HEAD_SCRIPTS


def test_the_head_and_the_benchmark_read_it_from_the_stacks_secret():
    """As a read-only file from the Secret (not an env var of the pod spec: checkov CKV_K8S_35); the head only,
    not the workers (they serve no HTTP), and the benchmark Job."""
    s = spec(benchmark=True)
    rec, _ = run(s)
    (secret,) = rec.of_type(SECRET)
    assert secret.inputs["metadata"]["name"] == s.api_key_secret_name
    data = secret.inputs["stringData"]
    assert is_rpc_secret(data), "the Secret's data reaches the engine as a Pulumi secret"
    assert set(unwrap_rpc_secret(data)) == {serving_spec.API_KEY_SECRET_KEY}
    key_file = f"{serving_spec.API_KEY_DIR}/{serving_spec.API_KEY_SECRET_KEY}"

    def reads_the_key(pod: dict) -> bool:
        (c,) = pod["containers"]
        volume = {v["name"]: v for v in pod["volumes"]}.get(raycluster.API_KEY_VOLUME)
        mount = [m for m in c["volumeMounts"] if m["name"] == raycluster.API_KEY_VOLUME]
        if volume is None:
            return False
        assert volume["secret"]["secretName"] == s.api_key_secret_name and volume["secret"]["optional"] is False
        assert mount == [{"name": raycluster.API_KEY_VOLUME, "mountPath": serving_spec.API_KEY_DIR, "readOnly": True}]
        assert {"name": serving_spec.API_KEY_FILE_ENV, "value": key_file} in c["env"]
        assert not any("secretKeyRef" in str(e.get("valueFrom")) for e in c["env"])
        return True

    rc = rec.one(RC).inputs["spec"]
    assert reads_the_key(rc["headGroupSpec"]["template"]["spec"])
    assert not any(reads_the_key(g["template"]["spec"]) for g in rc["workerGroupSpecs"])
    bench = [j for j in rec.of_type(JOB) if j.name.endswith("-benchmark")][0]
    assert reads_the_key(bench.inputs["spec"]["template"]["spec"])
    assert checks.benchmark_job(s)["spec"]["template"]["spec"]["volumes"] == bench.inputs["spec"]["template"]["spec"]["volumes"]


def test_the_head_hands_the_files_key_to_vllm_and_the_benchmark_to_its_client(tmp_path, monkeypatch):
    """ray_head.sh's last lines, run as the container runs them; benchmark.py's environment for `vllm bench serve`."""
    import subprocess

    from infra.k8s.scripts import benchmark

    key_file = tmp_path / "api-key"
    key_file.write_text(KEY)
    head = (script_files.SCRIPTS_DIR / serving_spec.HEAD_SCRIPT).read_text()
    tail = head[head.index('export PYTHONPATH="$here'):].replace('exec "$@"', 'echo "$VLLM_API_KEY|$PYTHONPATH"')
    done = subprocess.run(["bash", "-c", f'here=/scripts\nset -euo pipefail\n{tail}'],
                          env={"GPU_SERVING_API_KEY_FILE": str(key_file), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{KEY}|/scripts"
    env = benchmark.command_env({"GPU_SERVING_API_KEY_FILE": str(key_file), "HOME": "/tmp"})
    assert env[serving_spec.BENCHMARK_API_KEY_ENV] == KEY and env["HOME"] == "/tmp"
    assert benchmark.KEY_FILE_ENV == serving_spec.API_KEY_FILE_ENV and benchmark.BENCH_KEY_ENV == serving_spec.BENCHMARK_API_KEY_ENV
    assert "GPU_SERVING_API_KEY_FILE" in head and serving_spec.API_KEY_FILE_ENV == "GPU_SERVING_API_KEY_FILE"


def test_the_key_is_random_long_and_a_secret_output():
    doc = repo_stack("prod")
    (password,) = [r for r in doc["resources"] if r["type"] == "random:index/randomPassword:RandomPassword" and r["name"].endswith("-api-key")]
    assert password["inputs"]["length"] == API_KEY_LENGTH >= 32 and password["inputs"]["special"] is False
    assert 62 ** API_KEY_LENGTH > 2**256  # letters and digits: more than 256 bits
    (secret,) = [r for r in doc["resources"] if r["type"] == "kubernetes:core/v1:Secret" and r["name"].endswith("-api-key")]
    assert secret["inputs"]["stringData"], secret
    assert "apiKey" in doc["outputs"]
    assert json.dumps(doc["outputs"]["apiKey"]).find(KEY) == -1
