"""The requirement files by purpose, and who installs which (docs/architecture.md, "Set-up and requirements").

    requirements.txt        the Pulumi program: Pulumi.yaml has the Pulumi CLI install it for `pulumi up`
    requirements-tools.txt  -r requirements.txt + what `python -m infra ...` needs: bin/plan installs it
    requirements-dev.txt    -r requirements-tools.txt + the test tools: bin/test installs it

The program is run with everything outside requirements.txt made unimportable, and
every import of every source file is checked against the file that installs what it
runs with. bin/plan and bin/test are run against a stand-in Python that records what
they install.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests import requirement_files as rf
from tests.requirement_files import DEV, POLICY_PACK, PROGRAM, REPO_ROOT, TOOLS
from tests import yaml_text

PROJECT_PACKAGES = {"infra", "components", "policies", "tests", "benchmarks"}
TOOL_MODULES = {"typer", "rich", "matplotlib", "boto3", "botocore"}
# What `python3 -m venv` puts into every virtualenv of Python 3.11, whatever a requirement file says.
IN_EVERY_VENV = {"pip", "setuptools"}


# --------------------------------------------------------------------------- the files


def test_the_files_build_on_one_another_and_pin_every_requirement():
    assert rf.included(PROGRAM) == [PROGRAM]
    assert rf.included(TOOLS) == [TOOLS, PROGRAM]
    assert rf.included(DEV) == [DEV, TOOLS, PROGRAM]
    for path in (PROGRAM, TOOLS, DEV, POLICY_PACK):
        assert not rf.read(path).problems, rf.read(path).problems
    names = [rf.canonical(r.name) for p in (PROGRAM, TOOLS, DEV) for r in rf.read(p).requirements]
    assert len(names) == len(set(names)), f"pinned in more than one file: {sorted({n for n in names if names.count(n) > 1})}"
    # The tests run with exactly what the files pin (bin/test installs them).
    for name, (version, _) in rf.pins(DEV).items():
        assert importlib.metadata.version(name) == version, f"{name}: installed {importlib.metadata.version(name)}, pinned {version}"
    # The policy pack's own virtualenv runs the same Pulumi SDK as the program.
    program, pack = rf.pins(PROGRAM), rf.pins(POLICY_PACK)
    for name in set(program) & set(pack):
        assert program[name][0] == pack[name][0], f"{name}: {PROGRAM} pins {program[name][0]}, {POLICY_PACK} {pack[name][0]}"


def test_the_program_file_holds_no_tool_and_the_tools_file_holds_them_all():
    program, tools = rf.distributions(PROGRAM), rf.distributions(TOOLS)
    for module in TOOL_MODULES:
        providers = set(rf.providers(module))
        assert providers, f"no installed distribution provides {module}"
        assert not providers & program, f"{PROGRAM} brings in {module} ({providers & program}): the program does not need it"
        assert providers & tools, f"{TOOLS} does not bring in {module}"


# --------------------------------------------------------------------------- the program without the tools

_PROBE = textwrap.dedent(
    """\
    import json, sys

    blocked, attempts = set(json.loads(sys.argv[1])), []

    class Blocker:
        # Anything outside requirements.txt cannot be imported, and every attempt is written down
        # (an attempt that the importer catches would otherwise go unseen).
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in blocked:
                attempts.append(name)
                raise ImportError(f"{top} is not in requirements.txt")
            return None

    sys.meta_path.insert(0, Blocker())

    import components.stack, infra.config, infra.planning  # noqa: E401,F401
    from infra.preview.synth import synthesize

    resources = {stack: len(synthesize(stack)["resources"]) for stack in sys.argv[2:]}
    loaded = sorted({m.partition(".")[0] for m, mod in list(sys.modules.items()) if getattr(mod, "__file__", None)})
    print(json.dumps({"attempts": attempts, "loaded": loaded, "resources": resources}))
    """
)


def _blocked_modules() -> set[str]:
    """Every installed top-level module that no distribution of requirements.txt (or of a bare venv) provides."""
    allowed = rf.distributions(PROGRAM) | IN_EVERY_VENV
    modules = importlib.metadata.packages_distributions()
    return {m for m in modules if not any(rf.canonical(d) in allowed for d in modules[m])}


def test_the_program_runs_with_nothing_but_requirements_txt():
    """__main__.py and all it imports, run offline for each stack file, with every other package unimportable."""
    blocked = _blocked_modules()
    assert TOOL_MODULES <= blocked and {"pytest", "moto", "pulumi_policy"} <= blocked
    stacks = sorted(p.name.split(".")[1] for p in REPO_ROOT.glob("Pulumi.*.yaml"))
    assert {"prod", "test"} <= set(stacks)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PULUMI_", "AWS_"))}
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(sorted(blocked)), *stacks], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["attempts"] == [], f"the program tried to import {result['attempts']} (not in {PROGRAM})"
    assert all(n > 10 for n in result["resources"].values()), result["resources"]
    allowed = rf.distributions(PROGRAM) | IN_EVERY_VENV
    for module in result["loaded"]:
        if module in sys.stdlib_module_names or module in PROJECT_PACKAGES or module.startswith("_") or module == "__main__":
            continue
        providers = set(rf.providers(module))
        assert providers & allowed, f"the program loaded {module} ({providers or 'from no distribution'}), not from {PROGRAM}"


# --------------------------------------------------------------------------- every import of every source file


POD_SCRIPTS = REPO_ROOT / "infra" / "k8s" / "scripts"
# Run in venv-perf/, installed from requirements-perf.txt (infra/cli/aiconfigurator.py), not ./venv:
# the cross-check's driver, and the script that extracts A100's kernel tables from AIConfigurator's wheel.
AICONFIGURATOR_DRIVER = REPO_ROOT / "infra" / "cli" / "aiconfigurator_driver.py"
VENV_PERF_SCRIPTS = (AICONFIGURATOR_DRIVER, *(REPO_ROOT / "tests" / "fixtures" / "perf" / "kernels" / name
                                              for name in ("extract_a100.py", "extract_attention_head_dims.py")))


def _source_files() -> list[Path]:
    """What runs from this repository's venvs. The pod scripts run in the pods' images
    (torch and ray in the serving image, the hub client in the staging Job's), not
    from a requirements file; tests/test_pod_scripts.py checks what they import."""
    dirs = ("infra", "components", "policies", "tests", "benchmarks")
    files = [REPO_ROOT / "__main__.py", *(p for d in dirs for p in (REPO_ROOT / d).rglob("*.py"))]
    return sorted(p for p in files if POD_SCRIPTS not in p.parents and p not in VENV_PERF_SCRIPTS)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
            if node.module in PROJECT_PACKAGES:
                out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _module_file(module: str) -> Path | None:
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _program_files() -> set[Path]:
    """__main__.py and every project module it imports, directly or not."""
    todo, seen = [REPO_ROOT / "__main__.py"], set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for _, module in _imports(path):
            parts = module.split(".")
            if parts[0] in PROJECT_PACKAGES:
                todo += [f for i in range(1, len(parts) + 1) if (f := _module_file(".".join(parts[:i])))]
    return seen


def _third_party(path: Path) -> list[tuple[int, str]]:
    local = {p.stem for p in path.parent.glob("*.py")}  # siblings: the policy pack runs from policies/, tests share helpers
    return [(line, m) for line, m in _imports(path)
            if (top := m.partition(".")[0]) not in sys.stdlib_module_names and top not in PROJECT_PACKAGES
            and not (path.parent.name in ("policies", "tests") and top in local)]  # fmt: skip


def _file_for(path: Path, program: set[Path]) -> str:
    rel = path.relative_to(REPO_ROOT)
    if path in program:
        return PROGRAM
    if rel.parts[0] == "policies":
        return POLICY_PACK
    if rel.parts[0] in ("tests", "benchmarks"):
        return DEV
    return TOOLS


def test_every_import_comes_from_the_file_that_installs_what_it_runs_with():
    program = _program_files()
    assert {REPO_ROOT / "components" / "stack.py", REPO_ROOT / "infra" / "planning" / "__init__.py"} <= program
    assert REPO_ROOT / "infra" / "cli" / "app.py" not in program
    provided = {f: rf.distributions(f) | IN_EVERY_VENV for f in (PROGRAM, TOOLS, DEV, POLICY_PACK)}
    problems = []
    for path in _source_files():
        wanted = _file_for(path, program)
        for line, module in _third_party(path):
            top = module.partition(".")[0]
            providers = set(rf.providers(top))
            if not providers & provided[wanted]:
                problems.append(f"{path.relative_to(REPO_ROOT)}:{line} imports {module} "
                                f"({', '.join(sorted(providers)) or 'installed by nothing'}), which {wanted} does not install")  # fmt: skip
    assert not problems, "\n".join(problems)


def test_what_runs_in_venv_perf_imports_only_what_requirements_perf_txt_pins():
    """Those scripts' imports are not in ./venv to look up: each top-level module is a
    distribution requirements-perf.txt pins (pyyaml's is yaml), or the standard library."""
    pinned = {line.split("==")[0].strip().lower().replace("-", "_") for line in (REPO_ROOT / "requirements-perf.txt").read_text().splitlines()
              if "==" in line and not line.startswith("#")}  # fmt: skip
    module_of = {"pyyaml": "yaml"}
    modules = {module_of.get(name, name) for name in pinned}
    for path in VENV_PERF_SCRIPTS:
        for line, module in _imports(path):
            top = module.partition(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            assert top in modules, f"{path.relative_to(REPO_ROOT)}:{line} imports {module}, which requirements-perf.txt does not pin"


# --------------------------------------------------------------------------- who installs which


def test_pulumi_yaml_installs_requirements_txt_into_the_venv_of_the_program():
    doc = yaml_text.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    runtime = doc["runtime"]
    # The Python runtime's pip toolchain installs the project's requirements.txt into `virtualenv`.
    assert runtime["name"] == "python" and runtime["options"] == {"toolchain": "pip", "virtualenv": "venv"}
    assert (REPO_ROOT / PROGRAM).is_file()


_FAKE_PYTHON = textwrap.dedent(
    """\
    #!/bin/sh
    # Stands in for {venv}/bin/python: records pip (into which virtualenv) and the commands, computes like Python otherwise.
    case "$1 $2" in
      "-m pip") echo "install {venv} $*" >> "$FAKE_LOG"; exit 0 ;;
      "-m infra"|"-m pytest") echo "run $*${{PYTHONDONTWRITEBYTECODE:+ (with PYTHONDONTWRITEBYTECODE)}}" >> "$FAKE_LOG"; exit 0 ;;
    esac
    exec {python} "$@"
    """
)
SCAN = "requirements-scan.txt"  # the security scanner's, into venv-scan/ (infra/preview/scan.py)
PERF = "requirements-perf.txt"  # AIConfigurator's, into venv-perf/ (infra/cli/aiconfigurator.py)
BIN_TEST_INSTALLS = {"venv": DEV, "venv-scan": SCAN, "venv-perf": PERF}  # what bin/test sets up, side by side
UV = "requirements-uv.txt"  # the installer bin/venv.sh uses, into .tools/uv/
# Stands in for .tools/uv/bin/uv: records what it was asked to install.
_FAKE_UV = '#!/bin/sh\necho "install uv $*" >> "$FAKE_LOG"\n'


def _place_installed_promtool(root: Path) -> None:
    """A promtool stand-in with the stamp bin/install-promtool leaves (the pinned package's sha256 for this
    machine's architecture): bin/test's call of it then finds promtool installed and fetches nothing."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()
    pins = dict(re.findall(r'\[(\w+)\]="([0-9a-f]{64})"', (REPO_ROOT / "bin" / "install-promtool").read_text()))
    promtool = root / ".tools" / "bin" / "promtool"
    promtool.parent.mkdir(parents=True, exist_ok=True)
    promtool.write_text("#!/bin/sh\n")
    promtool.chmod(0o755)
    (promtool.parent / ".promtool.sha256").write_text(pins[arch] + "\n")


def _place_fake_uv(root: Path) -> None:
    """A fake uv where bin/venv.sh keeps the installer, with the stamp of the requirements-uv.txt at `root`."""
    fake = root / ".tools" / "uv" / "bin" / "uv"
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(_FAKE_UV)
    fake.chmod(0o755)
    (root / ".tools" / "uv" / ".requirements-uv.sha256").write_text(hashlib.sha256((root / UV).read_bytes()).hexdigest() + "\n")


def _repo_with_a_fake_venv(tmp_path: Path, venvs: tuple[str, ...] = ("venv",)) -> Path:
    """bin/ and the requirement files copied to `tmp_path`, with a fake python in each of `venvs`; the log they write to."""
    shutil.copytree(REPO_ROOT / "bin", tmp_path / "bin")
    for name in (PROGRAM, TOOLS, DEV, SCAN, PERF, UV):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    _place_fake_uv(tmp_path)
    _place_installed_promtool(tmp_path)
    for venv in venvs:
        fake = tmp_path / venv / "bin" / "python"
        fake.parent.mkdir(parents=True)
        fake.write_text(_FAKE_PYTHON.format(venv=venv, python=sys.executable))
        fake.chmod(0o755)
    return tmp_path / "log"


def _pip(venv: str, requirements: str) -> str:
    """The install line of `requirements` into `venv`: by uv, into that virtualenv's python. ./venv compiles
    modules on first import; venv-scan/ at install (checkov runs with PYTHONDONTWRITEBYTECODE=1)."""
    compile = " --compile-bytecode" if venv == "venv-scan" else ""
    return f"install uv pip install --quiet --python {venv}/bin/python{compile} -r {requirements}"


@pytest.mark.parametrize(("script", "installs", "runs"), [
    ("bin/plan", {"venv": TOOLS}, ["-m infra plan --stack prod", "-m infra synth --stack prod --out out/prod.synth.json", "-m infra check --stack prod"]),
    ("bin/test", BIN_TEST_INSTALLS, ["-m pytest -q -n auto --dist loadfile --no-loadscope-reorder"]),
], ids=["bin/plan", "bin/test"])  # fmt: skip
def test_bin_scripts_install_their_file_again_when_it_or_a_file_it_includes_changes(tmp_path, script, installs, runs):
    log = _repo_with_a_fake_venv(tmp_path, tuple(installs))
    # Set by the caller or not, the commands run without it (./venv is not byte-compiled at install: bin/venv.sh).
    env = {**os.environ, "FAKE_LOG": str(log), "PYTHONDONTWRITEBYTECODE": "1"}

    def run() -> tuple[list[str], list[str]]:
        """(the pip lines, the commands run)"""
        log.write_text("")
        proc = subprocess.run([str(tmp_path / script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = log.read_text().splitlines()
        assert lines == [line for line in lines if line.startswith("install ")] + [line for line in lines if line.startswith("run ")]
        # bin/test installs the two virtualenvs at the same time: their pip lines come in either order.
        return sorted(line for line in lines if line.startswith("install ")), [line.removeprefix("run ") for line in lines if line.startswith("run ")]

    assert run() == (sorted(_pip(venv, req) for venv, req in installs.items()), runs)  # first use: each virtualenv, then the commands
    assert run() == ([], runs)  # nothing changed: no install
    for venv, req in installs.items():
        for name in rf.included(req):
            with open(tmp_path / name, "a") as fh:
                fh.write("# changed\n")
            pips, _ = run()
            assert _pip(venv, req) in pips, f"{script} did not install {req} into {venv}/ again after {name} changed"
            assert pips == sorted(_pip(v, r) for v, r in installs.items() if name in rf.included(r))  # and nothing else
            assert run() == ([], runs)


def test_bin_test_and_the_scan_share_the_scanners_venv(tmp_path):
    """The stamp bin/test (bin/venv.sh) writes into venv-scan/ is the one `python -m infra scan` reads, and the other way
    round: neither installs again what the other did (the scan tests run the checkov bin/test set up)."""
    from infra.errors import UserError
    from infra.preview import scan, tool_venv

    log = _repo_with_a_fake_venv(tmp_path, tuple(BIN_TEST_INSTALLS))
    checkov = tmp_path / "venv-scan" / "bin" / "checkov"
    checkov.write_text("#!/bin/sh\n")
    checkov.chmod(0o755)
    env = {**os.environ, "FAKE_LOG": str(log)}
    with pytest.raises(UserError, match="not installed"):
        scan.ensure_checkov(tmp_path, install=False)
    proc = subprocess.run([str(tmp_path / "bin/test")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert _pip("venv-scan", SCAN) in log.read_text().splitlines()
    assert scan.ensure_checkov(tmp_path, install=False) == checkov  # up to date for the scan: no install

    (tmp_path / scan.VENV / scan.STAMP).write_text(tool_venv.sha256(tmp_path / SCAN) + "\n")  # as the scan's install writes it
    log.write_text("")
    proc = subprocess.run([str(tmp_path / "bin/test")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in log.read_text().splitlines() if line.startswith("install ")]


_FAKE_PYTHON3 = textwrap.dedent(
    """\
    #!/bin/sh
    # Stands in for python3 on PATH: `-m pip install ... --target DIR ...` records what it installs and leaves
    # a fake uv at DIR/bin/uv; anything else runs in Python.
    if [ "$1 $2" = "-m pip" ]; then
        echo "bootstrap $*" >> "$FAKE_LOG"
        while [ "$#" -gt 0 ] && [ "$1" != "--target" ]; do shift; done
        mkdir -p "$2/bin" && cp "$FAKE_UV" "$2/bin/uv"
        exit 0
    fi
    exec {python} "$@"
    """
)


@pytest.mark.parametrize("script", ["bin/test", "bin/plan"])
def test_the_installer_is_put_in_place_once_by_hash_and_again_when_its_pin_changes(tmp_path, script):
    """bin/venv.sh installs with uv: pip puts the pinned uv (requirements-uv.txt, hash-checked) into .tools/uv/
    before the first install, not on every run, and again when that file changes, without installing the
    virtualenvs again (their requirement files did not change)."""
    log = _repo_with_a_fake_venv(tmp_path, tuple(BIN_TEST_INSTALLS))
    shutil.rmtree(tmp_path / ".tools")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(_FAKE_PYTHON3.format(python=sys.executable))
    (shims / "python3").chmod(0o755)
    (tmp_path / "fake-uv").write_text(_FAKE_UV)
    (tmp_path / "fake-uv").chmod(0o755)
    env = {**os.environ, "FAKE_LOG": str(log), "FAKE_UV": str(tmp_path / "fake-uv"), "PATH": f"{shims}:{os.environ['PATH']}"}
    bootstrap = f"bootstrap -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --require-hashes --target .tools/uv -r {UV}"

    def run() -> list[str]:
        log.write_text("")
        proc = subprocess.run([str(tmp_path / script), *(["--help"] if script == "bin/plan" else [])], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return [line for line in log.read_text().splitlines() if not line.startswith("run ")]

    first = run()
    assert first[0] == bootstrap and first.count(bootstrap) == 1
    assert sorted(first[1:]) == sorted(_pip(v, r) for v, r in (BIN_TEST_INSTALLS if script == "bin/test" else {"venv": TOOLS}).items())
    assert run() == []
    with open(tmp_path / UV, "a") as fh:
        fh.write("# changed\n")
    assert run() == [bootstrap]
    assert run() == []


def test_the_installer_is_pinned_by_version_and_hash():
    lines = [line.strip().rstrip("\\").strip() for line in (REPO_ROOT / UV).read_text().splitlines()]
    lines = [line for line in lines if line and not line.startswith("#")]
    assert re.fullmatch(r"uv==\d+\.\d+\.\d+", lines[0]), lines[0]
    hashes = lines[1:]
    assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), hashes
    assert len(set(hashes)) == len(hashes)


def test_bin_plan_with_arguments_plans_only(tmp_path):
    """Arguments change the plan, not the stack's config: bin/plan then neither synthesises nor checks."""
    log = _repo_with_a_fake_venv(tmp_path)
    env = {**os.environ, "FAKE_LOG": str(log), "STACK": "test"}
    proc = subprocess.run([str(tmp_path / "bin/plan"), "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line for line in log.read_text().splitlines() if line.startswith("run ")] == ["run -m infra plan --stack test --json"]
    assert not (tmp_path / "out").exists()
