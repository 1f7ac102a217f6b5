"""The programs that run in pods (infra/k8s/scripts/): files that parse, ship, stay pure, and work.

Every script is linted with its own interpreter (`python -m py_compile`, and
`bash -n` or `sh -n` by its first line), every one is carried by a ConfigMap the
stack builds, and the Python ones import only the standard library at module
level and parse as Python 3.8 (the staging Job may run a slim or older Python).
Outside the scripts folder no Python string holds a program: none has more than
20 lines.

The serving pods' scripts then run for real, with the command and arguments of
the containers the builders make (the mounted folder mapped to the source
folder): Ray, vLLM, torchrun, fi_info and the cluster's endpoint are stand-ins
on PATH or on 127.0.0.1 that record what they were given. The staging program
runs in tests/test_staging.py.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.k8s import checks, raycluster, script_files, serving_spec, staging
from infra.k8s.scripts import benchmark
from infra.k8s.serving_spec import ServingSpec
from infra.planning import make_plan

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in script_files.SCRIPTS_DIR.iterdir() if p.suffix in (".py", ".sh"))
PROGRAMS = [p for p in SCRIPTS if p.name != "__init__.py"]
SHELLS = {"#!/bin/sh": "sh", "#!/bin/bash": "bash"}
MAX_INLINE_PROGRAM_LINES = 20


@lru_cache(maxsize=None)
def _plan(stack: str):
    return make_plan(load_stack_file(stack, REPO).plan_request())


def _deployment(stack: str):
    return _plan(stack).deployment()


def spec_of(stack: str = "prod", **overrides) -> ServingSpec:
    checks_config = load_stack_file(stack, REPO).checks
    base = dict(
        deployment=_deployment(stack), namespace="gpu-serving", image="img:1", ray_version="2.60.0",
        pvc_name="model-weights", ttft_p99_ms=load_stack_file(stack, REPO).serving.sla.ttft_p99_ms,
        tpot_p99_ms=load_stack_file(stack, REPO).serving.sla.tpot_p99_ms,
        nccl_busbw_floor_gbps=checks_config.nccl_bus_bandwidth_floor_gbps,
        vllm_version=load_stack_file(stack, REPO).serving.vllm_version,
        production=load_stack_file(stack, REPO).lifecycle.production,
    )  # fmt: skip
    return ServingSpec(**{**base, **overrides})


def _serving_config_map() -> dict:
    return raycluster.scripts_config_map(spec_of())


def local(argv: list[str]) -> list[str]:
    """A container's argv run here: the mounted scripts folder is the source folder, python3 this Python."""
    return [sys.executable if a == "python3" else a.replace(script_files.MOUNT_PATH, str(script_files.SCRIPTS_DIR)) for a in argv]


def scripts_copy(tmp_path: Path, memlock_rc: int = 0) -> Path:
    """The scripts folder with memlock_check.py replaced by a stand-in that logs its arguments to
    $MEMLOCK_LOG and exits `memlock_rc` (the check itself runs for real below)."""
    copy = tmp_path / "scripts"
    copy.mkdir()
    for path in script_files.SCRIPTS_DIR.iterdir():
        if path.is_file():
            (copy / path.name).write_text(path.read_text())
    (copy / "memlock_check.py").write_text(
        "import json, os, sys\n"
        "with open(os.environ['MEMLOCK_LOG'], 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"sys.exit({memlock_rc})\n"
    )
    return copy


def local_in(argv: list[str], scripts: Path) -> list[str]:
    """`local`, with the mounted folder mapped to `scripts`."""
    return [sys.executable if a == "python3" else a.replace(script_files.MOUNT_PATH, str(scripts)) for a in argv]


def memlock_calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "memlock.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def fake_bin(tmp_path: Path, **programs: str) -> Path:
    """A PATH directory with `python3` (this Python) and the given stand-in programs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    for name, text in programs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


# Records its arguments as JSON in $ARGV_LOG, prints $FAKE_OUTPUT, exits $FAKE_RC.
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["ARGV_LOG"], "w") as f:
    json.dump(sys.argv[1:], f)
with open(os.path.splitext(os.environ["ARGV_LOG"])[0] + ".pythonpath", "w") as f:
    f.write(os.environ.get("PYTHONPATH", ""))
sys.stdout.write(os.environ.get("FAKE_OUTPUT", ""))
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


def test_the_folder_holds_the_scripts():
    assert {p.suffix for p in PROGRAMS} == {".py", ".sh"} and len(PROGRAMS) >= 7


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_lints(path: Path, tmp_path: Path):
    if path.suffix == ".py":
        # The byte code goes to the test's directory, not next to the script.
        env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "py_compile", str(path)], capture_output=True, text=True, env=env)
    else:
        first = path.read_text().splitlines()[0]
        assert first in SHELLS, f"{path.name} must start with one of {sorted(SHELLS)}, not {first!r}"
        done = subprocess.run([SHELLS[first], "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_linter_catches_a_broken_script(tmp_path: Path):
    broken = tmp_path / "broken.sh"
    broken.write_text("#!/bin/bash\nif true; then\n  echo missing fi\n")
    assert subprocess.run(["bash", "-n", str(broken)], capture_output=True).returncode != 0


@pytest.mark.parametrize("path", [p for p in PROGRAMS if p.suffix == ".py"], ids=lambda p: p.name)
def test_python_scripts_import_only_the_standard_library_at_module_level(path: Path):
    tree = ast.parse(path.read_text(), feature_version=(3, 8))
    top = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            top += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            top.append((node.module or "").split(".")[0])
    assert top, path.name
    assert not [m for m in top if m not in sys.stdlib_module_names], f"{path.name} imports {top} at module level"
    if path.name == serving_spec.API_GUARD_SCRIPT:
        return  # a module vLLM imports (`--middleware api_guard.ApiKeyGuard`), not a program
    assert "__main__" in path.read_text(), f"{path.name} runs through `if __name__ == \"__main__\"`"


def test_every_script_is_shipped_in_a_config_map():
    shipped = set(_serving_config_map()["data"]) | set(staging.staging_config_map("w", "ns", {})["data"])
    assert shipped == {p.name for p in PROGRAMS}
    for name in shipped:
        assert script_files.read(name) == (script_files.SCRIPTS_DIR / name).read_text()


def test_a_script_outside_the_folder_is_refused():
    for name in ("../staging.py", "no_such_script.sh"):
        with pytest.raises(ValueError):
            script_files.read(name)


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal (f-strings joined) that is not a docstring."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | parts:
            out.append((node.lineno, node.value))
        elif isinstance(node, ast.JoinedStr):
            out.append((node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)))
    return out


def test_no_python_string_holds_a_program():
    sources = [p for d in ("infra", "components", "policies") for p in (REPO / d).rglob("*.py") if "scripts" not in p.relative_to(REPO).parts]
    long = [
        f"{p.relative_to(REPO)}:{line} ({n} lines)"
        for p in sources + [REPO / "__main__.py"]
        for line, text in _strings(ast.parse(p.read_text()))
        if (n := len(text.splitlines())) > MAX_INLINE_PROGRAM_LINES
    ]
    assert not long, f"programs belong in infra/k8s/scripts/: {long}"


def test_the_string_scan_sees_a_program(tmp_path: Path):
    program = "\n".join(f"print({i})" for i in range(MAX_INLINE_PROGRAM_LINES + 1))
    tree = ast.parse(f'"""A docstring is not a program."""\nSCRIPT = {program!r}\nX = f"a{{1}}b"\n')
    found = _strings(tree)
    assert [len(t.splitlines()) for _, t in found] == [MAX_INLINE_PROGRAM_LINES + 1, 1]


# ---- the Ray head ---------------------------------------------------------------------------------


FAKE_RAY_MODULE = """
import os
def init(**kw): pass
def shutdown(): pass
def nodes():
    n = int(os.environ["FAKE_NODES"])
    return [{"Alive": True, "Resources": {"GPU": float(os.environ["FAKE_GPUS_PER_NODE"]), "CPU": 4.0}} for _ in range(n)] + [
        {"Alive": False, "Resources": {"GPU": 8.0}}
    ]
"""
# A `ray start` that blocks when given --block, as the real one does.
FAKE_RAY_CLI = '#!/bin/sh\ncase " $* " in *" --block "*) sleep 30;; esac\necho "ray $*" >> "$RAY_LOG"\n'


def _ray_env(tmp_path: Path, nodes: int, gpus_per_node: int) -> dict[str, str]:
    (tmp_path / "py").mkdir(exist_ok=True)
    (tmp_path / "py" / "ray.py").write_text(FAKE_RAY_MODULE)
    return {"PYTHONPATH": str(tmp_path / "py"), "FAKE_NODES": str(nodes), "FAKE_GPUS_PER_NODE": str(gpus_per_node)}


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_the_head_starts_ray_without_block_waits_for_every_gpu_and_execs_vllm(stack, tmp_path):
    spec = spec_of(stack)
    plan = _plan(stack).to_json_dict()  # the plan's JSON edge, checked against what the pod runs
    head = raycluster.raycluster(spec)["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    bin_dir = fake_bin(tmp_path, ray=FAKE_RAY_CLI, vllm=RECORDER)
    env = {
        **_ray_env(tmp_path, plan["layout"]["nodes"], plan["layout"]["gpus_per_node"]),
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "KUBERAY_GEN_RAY_START_CMD": f"ray start --head  --block  --num-gpus={plan['pod']['gpus']} ",
        "RAY_LOG": str(tmp_path / "ray.log"),
        "ARGV_LOG": str(tmp_path / "vllm.json"),
        "MEMLOCK_LOG": str(tmp_path / "memlock.log"),
    }
    done = subprocess.run(local_in(head["command"] + head["args"], scripts_copy(tmp_path)), env=env, capture_output=True, text=True, timeout=25)
    assert done.returncode == 0, done.stdout + done.stderr
    # The locked-memory check ran first, and must pass on EFA nodes.
    assert memlock_calls(tmp_path) == [["--require"] if plan["pod"]["efa_interfaces"] else []]
    started = (tmp_path / "ray.log").read_text()
    assert "--head" in started and f"--num-gpus={plan['pod']['gpus']}" in started and "--block" not in started
    want = plan["layout"]["nodes"] * plan["layout"]["gpus_per_node"]
    assert f"Ray reports {want}/{want} GPUs on {plan['layout']['nodes']}/{plan['layout']['nodes']} nodes" in done.stdout
    checkpoint = plan["model"]["checkpoint"]
    served = json.loads((tmp_path / "vllm.json").read_text())
    middleware = serving_spec.API_GUARD_MIDDLEWARE
    assert served == ["serve", f"/models/{checkpoint}", "--served-model-name", checkpoint, *plan["vllm_args"], "--middleware", middleware]
    # vLLM imports the middleware by that path: the command ran with the scripts' folder on PYTHONPATH.
    module, cls = middleware.rsplit(".", 1)
    path = (tmp_path / "vllm.pythonpath").read_text()
    probe = subprocess.run([sys.executable, "-c", f"import {module}; {module}.{cls}"], env={"PYTHONPATH": path}, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


def _worker_run(tmp_path: Path, stack: str, memlock_rc: int) -> subprocess.CompletedProcess:
    worker = raycluster.raycluster(spec_of(stack))["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    env = {
        "PATH": f"{fake_bin(tmp_path, ray=FAKE_RAY_CLI)}:/usr/bin:/bin",
        "KUBERAY_GEN_RAY_START_CMD": "ray start --address=vllm-head-svc:6379 --num-gpus=8",
        "RAY_LOG": str(tmp_path / "ray.log"),
        "MEMLOCK_LOG": str(tmp_path / "memlock.log"),
    }
    return subprocess.run(local_in(worker["command"] + worker["args"], scripts_copy(tmp_path, memlock_rc)), env=env, capture_output=True, text=True, timeout=25)


def test_a_worker_checks_memlock_then_runs_kuberays_command_unchanged(tmp_path):
    done = _worker_run(tmp_path, "prod", 0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert memlock_calls(tmp_path) == [["--require"]]
    assert (tmp_path / "ray.log").read_text() == "ray start --address=vllm-head-svc:6379 --num-gpus=8\n"


def test_a_failed_memlock_check_stops_the_pod_before_ray(tmp_path):
    done = _worker_run(tmp_path, "prod", 1)
    assert done.returncode == 1 and not (tmp_path / "ray.log").exists()
    head = raycluster.raycluster(spec_of("prod"))["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    (tmp_path / "h").mkdir()
    env = {"PATH": f"{fake_bin(tmp_path / 'h', ray=FAKE_RAY_CLI, vllm=RECORDER)}:/usr/bin:/bin", "KUBERAY_GEN_RAY_START_CMD": "ray start --head --block",
           "RAY_LOG": str(tmp_path / "ray.log"), "ARGV_LOG": str(tmp_path / "vllm.json"), "MEMLOCK_LOG": str(tmp_path / "memlock.log")}  # fmt: skip
    done = subprocess.run(local_in(head["command"] + head["args"], scripts_copy(tmp_path / "h", 1)), env=env, capture_output=True, text=True, timeout=25)
    assert done.returncode == 1 and not (tmp_path / "ray.log").exists() and not (tmp_path / "vllm.json").exists()


def _memlock(tmp_path: Path, cap_eff: int, limit_kib: int, *flags: str, mem_total_kib: int = 2_097_152 * 1024) -> subprocess.CompletedProcess:
    import resource

    status = tmp_path / "status"
    status.write_text(f"Name:\tpython3\nCapInh:\t0000000000000000\nCapEff:\t{cap_eff:016x}\n")
    meminfo = tmp_path / "meminfo"  # /proc/meminfo's form; default: a p5.48xlarge's 2 TiB
    meminfo.write_text(f"MemTotal:       {mem_total_kib} kB\nMemFree:        1024 kB\n")

    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (limit_kib * 1024, limit_kib * 1024))

    program = script_files.SCRIPTS_DIR / "memlock_check.py"
    return subprocess.run([sys.executable, str(program), "--status", str(status), "--meminfo", str(meminfo), *flags],
                          capture_output=True, text=True, timeout=30, preexec_fn=lower)  # fmt: skip


def test_memlock_check_needs_a_limit_over_the_nodes_memory_or_ipc_lock(tmp_path):
    ipc_lock = 1 << 14
    ok = _memlock(tmp_path, ipc_lock, 64, "--require")
    assert ok.returncode == 0 and "max locked memory: 64 KiB (hard 64 KiB); node memory 2147483648 KiB; CAP_IPC_LOCK effective" in ok.stdout
    other_caps = (1 << 41) - 1 & ~ipc_lock  # everything but IPC_LOCK
    refused = _memlock(tmp_path, other_caps, 8192, "--require")
    assert refused.returncode == 1
    assert "EFA MEMLOCK CHECK FAILED: locked-memory limit is 8192 KiB" in refused.stderr and "baseRuntimeSpec" in refused.stderr
    noted = _memlock(tmp_path, 0, 8192)  # not an EFA node: said, not fatal
    assert noted.returncode == 0 and "note: locked-memory limit" in noted.stdout
    # No capability, no root: a limit that covers all of the node's memory is enough (what the nodes' base
    # runtime spec gives, infra/aws/gpu_nodes.py); one byte short of it is not.
    assert _memlock(tmp_path, 0, 8192, "--require", mem_total_kib=8192).returncode == 0
    short = _memlock(tmp_path, 0, 8191, "--require", mem_total_kib=8192)
    assert short.returncode == 1 and "node memory 8192 KiB; CAP_IPC_LOCK absent" in short.stdout
    assert "CAP_IPC_LOCK absent" in refused.stdout  # every capability but IPC_LOCK is not IPC_LOCK


def test_memlock_check_reads_what_it_cannot_find_as_nothing(tmp_path):
    """A status without CapEff has no capability, a meminfo without MemTotal no memory to cover: only the
    capability or an unlimited limit would do then."""
    status, meminfo = tmp_path / "status", tmp_path / "meminfo"
    status.write_text("Name:\tpython3\n")
    meminfo.write_text("MemFree:        1024 kB\n")
    program = script_files.SCRIPTS_DIR / "memlock_check.py"

    def lower() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_MEMLOCK, (64 * 1024, 64 * 1024))

    done = subprocess.run([sys.executable, str(program), "--require", "--status", str(status), "--meminfo", str(meminfo)],
                          capture_output=True, text=True, timeout=30, preexec_fn=lower)  # fmt: skip
    assert done.returncode == 1 and "node memory 0 KiB; CAP_IPC_LOCK absent" in done.stdout


def test_memlock_check_reads_this_machines_proc_by_default():
    done = subprocess.run([sys.executable, str(script_files.SCRIPTS_DIR / "memlock_check.py")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    with open("/proc/meminfo") as f:
        total_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert f"node memory {total_kib} KiB" in done.stdout


def test_the_head_refuses_to_start_without_kuberays_command(tmp_path):
    head = raycluster.raycluster(spec_of("test"))["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    env = {"PATH": f"{fake_bin(tmp_path, vllm=RECORDER)}:/usr/bin:/bin", "ARGV_LOG": str(tmp_path / "vllm.json"), "MEMLOCK_LOG": str(tmp_path / "m.log")}
    done = subprocess.run(local_in(head["command"] + head["args"], scripts_copy(tmp_path)), env=env, capture_output=True, text=True, timeout=25)
    assert done.returncode != 0 and "ray.io/overwrite-container-cmd" in done.stderr
    assert not (tmp_path / "vllm.json").exists()


@pytest.mark.parametrize("nodes, expected_rc", [(4, 0), (3, 1)])
def test_ray_wait_gives_up_without_every_node(tmp_path, nodes, expected_rc):
    env = {**_ray_env(tmp_path, nodes, 8), "PATH": "/usr/bin:/bin"}
    program = script_files.SCRIPTS_DIR / "ray_wait.py"
    done = subprocess.run([sys.executable, str(program), "32", "4", "0"], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == expected_rc, done.stderr
    assert f"{nodes * 8}/32 GPUs on {nodes}/4 nodes" in done.stdout
    assert ("gave up" in done.stderr) == (expected_rc == 1)


# ---- the serving pods' wait for the weights ------------------------------------------------------


def test_serving_pods_wait_without_a_limit_until_the_weights_are_staged(tmp_path):
    marker = tmp_path / "models" / "org" / "name" / ".gpu-serving-complete"
    spec = spec_of("prod", marker_path=str(marker))
    inits = [t["spec"]["initContainers"][-1] for t in [raycluster.head_pod_template(spec), raycluster.worker_pod_template(spec)]]
    assert inits[0] == inits[1]
    argv = local(inits[0]["command"] + inits[0]["args"])
    waiting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        time.sleep(1.5)
        assert waiting.poll() is None, "still waiting, with no time limit"
    finally:
        os.killpg(waiting.pid, signal.SIGKILL)  # the shell and its sleep
        waiting.communicate()
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    assert done.returncode == 0 and "ready" in done.stdout


# ---- the EFA check --------------------------------------------------------------------------------

EFA_LOG = (
    "NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 32 nics)\nNCCL INFO Using network Libfabric\n"
    "NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA\nGPU_SERVING_BUSBW_GBPS=312.480\n"
)


@pytest.mark.parametrize(
    "fi_info_rc, torchrun_rc, log, rc, message",
    [
        (0, 0, EFA_LOG, 0, "EFA check passed"),
        (0, 0, EFA_LOG.replace("312.480", "41.200"), 1, "below the floor"),
        (0, 0, "NCCL INFO Using network Socket\nGPU_SERVING_BUSBW_GBPS=3.1\n", 1, "Socket transport"),
        (0, 3, "", 3, "the all-reduce exited with 3"),
        (1, 0, EFA_LOG, 1, "fi_info -p efa lists no EFA device"),
    ],
)
def test_the_efa_check_job_runs_fi_info_the_all_reduce_and_its_verdict(tmp_path, fi_info_rc, torchrun_rc, log, rc, message):
    spec = spec_of("prod", efa_check=True)
    job, svc = checks.efa_check_job(spec), checks.efa_check_service(spec)
    c = job["spec"]["template"]["spec"]["containers"][0]
    bin_dir = fake_bin(tmp_path, torchrun=RECORDER, fi_info=f"#!/bin/sh\nexit {fi_info_rc}\n")
    env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "JOB_COMPLETION_INDEX": "1",
        "TMPDIR": str(tmp_path),
        "ARGV_LOG": str(tmp_path / "torchrun.json"),
        "FAKE_OUTPUT": log,
        "FAKE_RC": str(torchrun_rc),
        "MEMLOCK_LOG": str(tmp_path / "memlock.log"),
    }
    scripts = scripts_copy(tmp_path)
    done = subprocess.run(local_in(c["command"] + c["args"], scripts), env=env, capture_output=True, text=True, timeout=30)
    assert memlock_calls(tmp_path) == [["--require"]]
    assert done.returncode == rc, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    if fi_info_rc:
        assert not (tmp_path / "torchrun.json").exists()
        return
    # One process per GPU on each of the Job's pods, the rendezvous at pod 0 by the headless Service's name.
    master = f"{job['metadata']['name']}-0.{svc['metadata']['name']}.{spec.namespace}.svc.cluster.local"
    assert json.loads((tmp_path / "torchrun.json").read_text()) == [
        "--nnodes", str(job["spec"]["completions"]),
        "--nproc-per-node", str(_plan("prod").to_json_dict()["pod"]["gpus"]),
        "--node-rank", "1",
        "--master-addr", master,
        "--master-port", str(svc["spec"]["ports"][0]["port"]),
        str(scripts / "efa_allreduce.py"), "run",
    ]  # fmt: skip


# ---- the benchmark ----------------------------------------------------------------------------------


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200 if self.path == serving_spec.PROBE_PATH else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture()
def endpoint():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


# A `vllm bench serve --save-result` that writes $FAKE_RESULT where it is told to.
FAKE_BENCH = f"""#!{sys.executable}
import json, os, sys
argv = sys.argv[1:]
with open(os.environ["ARGV_LOG"], "w") as f:
    json.dump(argv, f)
out = os.path.join(argv[argv.index("--result-dir") + 1], argv[argv.index("--result-filename") + 1])
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as f:
    f.write(os.environ["FAKE_RESULT"])
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""
RESULT = {"completed": 200, "p99_ttft_ms": 231.7, "p99_tpot_ms": 33.8}


@pytest.mark.parametrize(
    "result, bench_rc, rc, message",
    [
        (RESULT, 0, 0, "p99 TTFT 231.7 ms"),
        ({**RESULT, "p99_tpot_ms": 90.0}, 0, 1, "BENCHMARK FAILED: p99 TPOT 90.0 ms is not below"),
        ({**RESULT, "completed": 150}, 0, 1, "50 of 200 requests failed"),
        (RESULT, 2, 2, "exited with 2"),
    ],
)
def test_the_benchmark_job_waits_for_the_endpoint_runs_and_judges(tmp_path, endpoint, result, bench_rc, rc, message):
    spec = spec_of("prod", benchmark=True)
    c = checks.benchmark_job(spec)["spec"]["template"]["spec"]["containers"][0]
    service = f"http://{spec.service_name}.{spec.namespace}.svc.cluster.local:{serving_spec.API_PORT}"

    def here(argv):
        return [a.replace(service, endpoint).replace(checks.BENCHMARK_RESULT_DIR, str(tmp_path / "bench"))
                .replace(checks.BENCHMARK_SUMMARY_PATH, str(tmp_path / "termination-log")) for a in local(argv)]  # fmt: skip

    env = {
        "PATH": f"{fake_bin(tmp_path, vllm=FAKE_BENCH)}:/usr/bin:/bin",
        "ARGV_LOG": str(tmp_path / "bench.json"),
        "FAKE_RESULT": json.dumps(result),
        "FAKE_RC": str(bench_rc),
    }
    done = subprocess.run(here(c["command"] + c["args"]), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == rc, done.stdout + done.stderr
    assert message in done.stdout + done.stderr
    assert json.loads((tmp_path / "bench.json").read_text()) == here(checks.benchmark_argv(spec))[1:]
    if rc == 0:
        assert f"< {spec.ttft_p99_ms:g}" in done.stdout  # the thresholds the stack config gave
    # The outcome is the container's termination message (Kubernetes keeps it in the pod's status).
    assert c["terminationMessagePath"] == checks.BENCHMARK_SUMMARY_PATH
    summary = json.loads((tmp_path / "termination-log").read_text())
    assert summary["passed"] == (rc == 0) and summary["sla"] == {"ttft_p99_ms": spec.ttft_p99_ms, "tpot_p99_ms": spec.tpot_p99_ms}
    assert (message.removeprefix("BENCHMARK FAILED: ") in " ".join(summary["problems"])) == (rc != 0)
    if bench_rc == 0:
        assert summary["measured"]["p99_tpot_ms"] == result["p99_tpot_ms"]


def test_the_benchmark_sends_the_stacks_workload_at_the_planned_capacity_and_prints_the_prediction(tmp_path, endpoint):
    from components.stack import benchmark_load

    # The stack with its benchmark Job on: the plan predicts what the Job will measure.
    plan = make_plan(load_stack_file("prod", REPO).plan_request().replace(predict_benchmark=True))
    assert _plan("prod").benchmark is None  # prod runs no benchmark Job, so nothing to predict
    spec = spec_of("prod", benchmark=True, **benchmark_load(plan))
    argv = checks.benchmark_argv(spec)

    def flag(name):
        return argv[argv.index(name) + 1]

    # The workload's mean lengths and the SLA capacity, as the plan has them.
    w, load = plan.request.workload, plan.benchmark
    assert int(flag("--max-concurrency")) == plan.performance.concurrency == load.concurrency
    assert int(flag("--random-input-len")) + int(flag("--random-prefix-len")) == w.input_tokens
    assert int(flag("--random-output-len")) == w.output_tokens and "--ignore-eos" in argv
    # ShareGPT's spread (0.8) as vLLM's uniform lengths allow: R < 1.
    assert 0 < float(flag("--random-range-ratio")) < 1
    predicted = dict(load.predicted)
    assert predicted["output_throughput"] > 0 and predicted["p99_tpot_ms"] > 0
    c = checks.benchmark_job(spec)["spec"]["template"]["spec"]["containers"][0]
    service = f"http://{spec.service_name}.{spec.namespace}.svc.cluster.local:{serving_spec.API_PORT}"
    here = [a.replace(service, endpoint).replace(checks.BENCHMARK_RESULT_DIR, str(tmp_path / "bench"))
            .replace(checks.BENCHMARK_SUMMARY_PATH, str(tmp_path / "termination-log")) for a in local(c["command"] + c["args"])]  # fmt: skip
    measured = {**RESULT, "completed": spec.benchmark_prompts, "output_throughput": predicted["output_throughput"] / 2}
    env = {"PATH": f"{fake_bin(tmp_path, vllm=FAKE_BENCH)}:/usr/bin:/bin", "ARGV_LOG": str(tmp_path / "bench.json"),
           "FAKE_RESULT": json.dumps(measured)}  # fmt: skip
    done = subprocess.run(here, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr  # the verdict is on the measurement alone
    row = next(line for line in done.stdout.splitlines() if line.startswith("output_throughput"))
    assert row.split()[1:] == [f"{predicted['output_throughput']:.2f}", f"{measured['output_throughput']:.2f}", "0.50"]
    assert "median_ttft_ms" in done.stdout and "-" in next(x for x in done.stdout.splitlines() if x.startswith("median_ttft_ms"))
    # MTP is on in prod's plan: the assumed acceptance rate is printed for the measured one to sit beside.
    assert plan.knobs.num_speculative_tokens and "spec_decode_acceptance_rate" in predicted

    # Read back as `kubectl get pods -o json` shows it, the outcome is priced in the plan's terms.
    pod = {"kind": "List", "items": [{"kind": "Pod", "metadata": {"name": "b-1", "creationTimestamp": "2026-01-01T00:00:00Z"},
                                      "status": {"containerStatuses": [{"name": "benchmark", "state": {"terminated": {
                                          "exitCode": 0, "message": (tmp_path / "termination-log").read_text()}}}]}}]}  # fmt: skip
    report = subprocess.run([sys.executable, "-m", "infra", "benchmark-report", "-", "--stack", "prod"], input=json.dumps(pod),
                            capture_output=True, text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert report.returncode == 0, report.stderr
    out = " ".join(report.stdout.replace("│", " ").split())
    assert f"output_throughput {predicted['output_throughput']:,.2f} {measured['output_throughput']:,.2f} 0.50" in out
    hourly = plan.instance.price_usd_per_hour * plan.nodes
    assert f"${hourly / (measured['output_throughput'] * 3600) * 1e6:,.2f} cloud" in out
    assert f"gpu-serving:cost.throughputTokensPerSecond: {measured['output_throughput']:.0f}" in out


def test_the_benchmark_report_reads_the_log_too_and_names_what_is_missing():
    from infra.cli import benchmark_report as br
    from infra.errors import UserError

    outcome = benchmark.summary({"completed": 10, "p99_ttft_ms": 300.0, "p99_tpot_ms": 20.0}, {"p99_ttft_ms": 200.0},
                                250.0, 40.0, ["p99 TTFT 300.0 ms is not below 250 ms"])  # fmt: skip
    log = f"starting\n{benchmark.SUMMARY_PREFIX}{json.dumps(outcome)}\n"
    read = br.read_summary(log)
    assert not read["passed"] and "missed: p99 TTFT 300.0 ms" in br.verdict_line(read)
    ttft = next(r for r in br.rows(read) if r.metric == "p99_ttft_ms")
    assert ttft.ratio == pytest.approx(1.5)
    running = {"kind": "Pod", "metadata": {"name": "b-1"}, "status": {"containerStatuses": [{"state": {"running": {}}}]}}
    with pytest.raises(UserError, match="b-1 has not finished"):
        br.read_summary(json.dumps(running))
    crashed = {"kind": "Pod", "metadata": {"name": "b-2"}, "status": {"containerStatuses": [
        {"state": {"terminated": {"exitCode": 137, "message": "Killed"}}}]}}  # fmt: skip
    with pytest.raises(UserError, match="b-2 ended \\(exit 137\\) without a summary; its log's tail: Killed"):
        br.read_summary(json.dumps(crashed))
    with pytest.raises(UserError, match="no 'benchmark summary:' line"):
        br.read_summary("INFO some other log\n")
    with pytest.raises(UserError, match="no pod"):
        br.read_summary(json.dumps({"kind": "List", "items": []}))


def test_the_benchmark_gives_up_on_an_endpoint_that_never_answers(tmp_path, capsys):
    argv = [
        "--health-url", "http://127.0.0.1:9/health", "--timeout-s", "0", "--result", str(tmp_path / "r.json"),
        "--ttft-p99-ms", "250", "--tpot-p99-ms", "40", "--requests", "1", "--", "false",
    ]  # fmt: skip
    assert benchmark.main(argv) == 1
    assert "did not become healthy" in capsys.readouterr().err
