"""The GitHub Actions workflows (.github/workflows): they parse, call only commands that exist, pin their
actions by commit SHA, ask for the least permissions (none at the top, each job its own), never run on
`pull_request_target`, get an OIDC token only in a job that names its GitHub Environment and assumes its own
role there (ci/README.md; the roles' policies: tests/test_ci_roles.py), touch the cloud only where that role
is configured, and install the requirement file that provides what their commands import
(tests/test_requirements.py).

Every `python -m infra ...` a `run:` step calls is checked against the CLI: the command must be registered
(a workflow calling one that is not fails, naming the registered ones), `--help` must exit 0, and every
`--option` the step passes must be one the command takes.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from infra.cli.app import app
from tests.requirement_files import DEV, PROGRAM, TOOLS, included
from tests import yaml_text

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO_ROOT / ".github" / "workflows"
NAMES = ("pull-request.yml", "ephemeral.yml", "nightly-sweep.yml")

# Inputs of pulumi/actions v7.0.0 (its action.yml, `inputs:`; v6.6.1 has the same ones).
PULUMI_ACTION_INPUTS = {
    "always-include-summary", "cloud-url", "color", "command", "comment-on-pr", "comment-on-pr-number",
    "comment-on-summary", "config-map", "continue-on-error", "debug", "diff", "edit-pr-comment", "exclude",
    "exclude-dependents", "exclude-protected", "expect-no-changes", "github-token", "log-flow", "log-verbosity",
    "message", "parallel", "plan", "policyPackConfigs", "policyPacks", "pulumi-version", "pulumi-version-file",
    "refresh", "remove", "replace", "secrets-provider", "stack-name", "suppress-outputs", "suppress-progress",
    "target", "target-dependents", "upsert", "work-dir",
}  # fmt: skip
ALLOWED_PERMISSIONS = {("contents", "read"), ("pull-requests", "write"), ("id-token", "write")}
CREDENTIALS_ACTION = "aws-actions/configure-aws-credentials"

# Each job that reaches AWS: the repository variable holding its role's ARN, the GitHub Environment it runs in
# (its OIDC subject is repo:<owner>/<repo>:environment:<name>) and its role's policies, ci/roles/<role>.*.json.
CLOUD_JOBS = {
    ("pull-request.yml", "preview"): ("AWS_PREVIEW_ROLE_ARN", "preview", "preview"),
    ("ephemeral.yml", "ephemeral"): ("AWS_EPHEMERAL_ROLE_ARN", "ephemeral", "ephemeral"),
    ("nightly-sweep.yml", "sweep"): ("AWS_SWEEPER_ROLE_ARN", "sweeper", "sweeper"),
}
ROLES_DIR = REPO_ROOT / "ci" / "roles"


def load(name: str) -> dict:
    path = WORKFLOWS / name
    assert path.is_file(), f"missing workflow {path}"
    doc = yaml_text.safe_load(path.read_text())
    assert isinstance(doc, dict), name
    return doc


def triggers(doc: dict) -> dict:
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads a bare `on` key as true
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return {k: None for k in on}
    return dict(on or {})


def steps(job: dict) -> list[dict]:
    return list(job.get("steps") or [])


def action(step: dict) -> str:
    return str(step.get("uses", "")).split("@", 1)[0]


def uses(job: dict, name: str) -> list[dict]:
    return [s for s in steps(job) if action(s) == name]


def effective_permissions(doc: dict, job: dict) -> dict:
    return dict(job.get("permissions", doc.get("permissions")) or {})


# --------------------------------------------------------------------------- `python -m infra` in run steps

_EXPR = re.compile(r"\$\{\{.*?\}\}", re.S)
_STOP = {"|", "||", "&", "&&", ";", ";;", "(", ")", ">", ">>", "<", "2>", "2>&1"}


def _logical_lines(script: str) -> list[str]:
    return _EXPR.sub("EXPR", script).replace("\\\n", " ").splitlines()


def infra_calls(script: str) -> list[list[str]]:
    """The argument lists of every `python -m infra ...` in a shell script."""
    calls = []
    for line in _logical_lines(script):
        if "-m infra" not in line:
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
        for i in range(len(tokens) - 1):
            if tokens[i] == "-m" and tokens[i + 1] == "infra":
                args = []
                rest = tokens[i + 2 :]
                for j, tok in enumerate(rest):
                    if tok in _STOP or tok.startswith((">", "<", "|", "&", ";", ")")):
                        break
                    if tok.isdigit() and j + 1 < len(rest) and rest[j + 1].startswith((">", "<")):
                        break  # a redirection of a file descriptor: 2>&1, 2> file
                    args.append(tok)
                calls.append(args)
    return calls


def _collect() -> list[tuple[str, str, tuple[str, ...]]]:
    out = []
    for name in NAMES:
        path = WORKFLOWS / name
        if not path.is_file():
            continue
        doc = yaml_text.safe_load(path.read_text()) or {}
        for job_id, job in (doc.get("jobs") or {}).items():
            for step in steps(job):
                for call in infra_calls(str(step.get("run", ""))):
                    out.append((name, job_id, tuple(call)))
    return out


CALLS = _collect()


@functools.lru_cache(maxsize=None)
def root_command():
    """The CLI as a command tree (typer's own click: groups have `commands`, commands have `params`)."""
    return typer.main.get_command(app)


def resolve(args: tuple[str, ...]):
    """The command path (`synth`, `ephemeral up`) and the command it names; fail when not registered."""
    command = root_command()
    path: list[str] = []
    rest = list(args)
    while hasattr(command, "commands"):
        if not rest:
            pytest.fail(f"`python -m infra {' '.join(path)}` needs a subcommand")
        name = rest.pop(0)
        sub = command.commands.get(name)
        if sub is None:
            known = ", ".join(sorted(command.commands))
            pytest.fail(f"`python -m infra {' '.join([*path, name])}` is not a registered command "
                        f"(registered: {known})", pytrace=False)
        path.append(name)
        command = sub
    return path, command


@functools.lru_cache(maxsize=None)
def help_exit_code(path: tuple[str, ...]) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "infra", *path, "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_workflows_call_the_project():
    called = {c[2][:2] if c[2][:1] == ("ephemeral",) else c[2][:1] for c in CALLS}
    for expected in [("synth",), ("diff",), ("check",), ("scan",), ("ephemeral", "up"), ("ephemeral", "test"),
                     ("ephemeral", "down"), ("sweep",)]:
        assert expected in called, f"no workflow runs `python -m infra {' '.join(expected)}`"


def unknown_flags(path: list[str], command, args: tuple[str, ...]) -> list[str]:
    """The `--options` in `args` that `command` does not take."""
    options = set()
    for param in command.params:
        options.update(getattr(param, "opts", []))
        options.update(getattr(param, "secondary_opts", []))
    flags = [tok.split("=", 1)[0] for tok in args[len(path):] if tok.startswith("--")]
    return [f for f in flags if f not in options]


@pytest.mark.parametrize("workflow,job,args", CALLS, ids=[f"{w}:{j}:{' '.join(a)}" for w, j, a in CALLS])
def test_every_infra_command_a_workflow_runs_exists(workflow, job, args):
    path, command = resolve(args)
    code, output = help_exit_code(tuple(path))
    assert code == 0, f"`python -m infra {' '.join(path)} --help` exited {code}:\n{output}"
    bad = unknown_flags(path, command, args)
    assert not bad, f"{workflow} ({job}) passes {bad} to `python -m infra {' '.join(path)}`, which does not take them"


def test_the_command_check_catches_what_does_not_exist():
    path, command = resolve(("ephemeral", "up", "--from", "test", "--ttl", "2"))
    assert path == ["ephemeral", "up"]
    assert unknown_flags(path, command, ("ephemeral", "up", "--from", "test", "--tll", "2")) == ["--tll"]
    with pytest.raises(pytest.fail.Exception, match="`python -m infra no-such-command` is not a registered command"):
        resolve(("no-such-command", "--stack", "prod"))
    with pytest.raises(pytest.fail.Exception, match="`python -m infra ephemeral nope` is not a registered command"):
        resolve(("ephemeral", "nope"))


def test_the_command_extraction_sees_through_shell_syntax():
    script = 'if x; then\n  (cd head && venv/bin/python -m infra synth --stack "$s" --out ../o.json) 2> e\nfi\n' \
             'venv/bin/python -m infra sweep --yes "${r[@]}" 2>&1 | tee r.txt\n' \
             'venv/bin/python -m infra ephemeral up --from "$F" \\\n  --ttl ${{ inputs.ttl }}\n'
    assert infra_calls(script) == [["synth", "--stack", "$s", "--out", "../o.json"],
                                   ["sweep", "--yes", "${r[@]}"],
                                   ["ephemeral", "up", "--from", "$F", "--ttl", "EXPR"]]


# --------------------------------------------------------------------------- what each job installs

_PIP_INSTALL = re.compile(r"""pip"?\s+install\b[^\n]*?\s(?:-r|--requirement)\s+["']?([\w./-]+)""")
_SCRIPT = r"(?:^|[\s;&(|])bin/{}(?:$|[\s;&)|])"


def missing_requirements(job: dict) -> list[str]:
    """What a job runs before the requirement file it needs is installed, one line each.

    `python -m infra ...` needs requirements-tools.txt (bin/plan installs it); bin/test installs and needs
    requirements-dev.txt; `pulumi/actions` with a command runs the program (requirements.txt) and the policy
    pack it names (its own requirements.txt). A `pip install -r FILE` installs FILE and what it includes.
    """
    installed: set[str] = set()
    problems = []
    for step in steps(job):
        run = str(step.get("run", ""))
        for found in _PIP_INSTALL.findall(run):
            installed |= set(included(found))
        if re.search(_SCRIPT.format("test"), run, re.M):
            installed |= set(included(DEV))
        if re.search(_SCRIPT.format("plan"), run, re.M):
            installed |= set(included(TOOLS))
        needs = []
        if infra_calls(run):
            needs.append((TOOLS, "`python -m infra`"))
        with_ = step.get("with") or {}
        if action(step) == "pulumi/actions" and with_.get("command"):
            needs.append((PROGRAM, f"`pulumi {with_['command']}` (the program)"))
            if with_.get("policyPacks"):
                needs.append((f"{with_['policyPacks']}/requirements.txt", "the policy pack"))
        for file, what in needs:
            if file not in installed:
                problems.append(f"step {step.get('name', '?')!r} runs {what}, which needs {file}; "
                                f"installed before it: {sorted(installed) or 'nothing'}")  # fmt: skip
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_each_job_installs_what_its_commands_need(name):
    for job_id, job in load(name)["jobs"].items():
        problems = missing_requirements(job)
        assert not problems, f"{name}: {job_id}: " + "; ".join(problems)


def test_the_install_check_catches_a_missing_file():
    run = lambda script, **kw: {"name": script.split()[0], "run": script, **kw}  # noqa: E731
    only_program = {"steps": [run("venv/bin/pip install --quiet -r requirements.txt"), run("venv/bin/python -m infra sweep --yes")]}
    (problem,) = missing_requirements(only_program)
    assert "`python -m infra`" in problem and TOOLS in problem and "requirements.txt" in problem
    tools = {"steps": [run("pip install -r requirements-tools.txt"), run("venv/bin/python -m infra sweep")]}
    assert missing_requirements(tools) == []
    late = {"steps": [run("venv/bin/python -m infra synth --stack prod"), run("bin/test")]}
    assert len(missing_requirements(late)) == 1  # installed, but only after the command
    preview = {"steps": [run("pip install -r requirements.txt"),
                         {"uses": "pulumi/actions@v7", "with": {"command": "preview", "policyPacks": "policies"}}]}
    (problem,) = missing_requirements(preview)
    assert "policies/requirements.txt" in problem


# --------------------------------------------------------------------------- every workflow


@pytest.mark.parametrize("name", NAMES)
def test_workflow_parses_and_every_job_is_bounded(name):
    doc = load(name)
    assert doc.get("name")
    assert triggers(doc)
    assert doc.get("jobs")
    for job_id, job in doc["jobs"].items():
        assert job.get("runs-on"), f"{name}: job {job_id} has no runs-on"
        assert isinstance(job.get("timeout-minutes"), int) and 0 < job["timeout-minutes"] <= 360, \
            f"{name}: job {job_id} needs a timeout (at most GitHub's 6 hours)"
        assert steps(job), f"{name}: job {job_id} has no steps"
        for step in steps(job):
            assert ("uses" in step) != ("run" in step), f"{name}: {job_id}: a step needs exactly one of uses/run: {step}"


@pytest.mark.parametrize("name", NAMES)
def test_permissions_are_minimal(name):
    doc = load(name)
    assert doc.get("permissions") == {}, f"{name}: top-level `permissions: {{}}` (the default token may write everything); each job asks for its own"
    for job_id, job in doc["jobs"].items():
        assert isinstance(job.get("permissions"), dict), f"{name}: {job_id}: no permissions of its own"
        perms = effective_permissions(doc, job)
        assert isinstance(perms, dict), f"{name}: {job_id}: permissions must be a mapping, not {perms!r}"
        extra = set(perms.items()) - ALLOWED_PERMISSIONS
        assert not extra, f"{name}: {job_id}: more permissions than needed: {sorted(extra)}"
        assert perms.get("contents") == "read"
        # The OIDC token only where AWS credentials are configured from it.
        needs_oidc = bool(uses(job, CREDENTIALS_ACTION))
        assert (perms.get("id-token") == "write") == needs_oidc, f"{name}: {job_id}: id-token: write iff it assumes an AWS role"
    # The top level grants nothing the jobs do not need.
    top = set(doc["permissions"].items())
    needed = set().union(*(set(effective_permissions(doc, j).items()) for j in doc["jobs"].values()))
    assert top <= needed | {("contents", "read")}, f"{name}: top-level permissions {sorted(top - needed)} are used by no job"


@pytest.mark.parametrize("name", NAMES)
def test_cloud_jobs_run_only_when_credentials_are_configured(name):
    for job_id, job in load(name)["jobs"].items():
        creds = uses(job, CREDENTIALS_ACTION)
        touches_cloud = bool(creds) or any(action(s) == "pulumi/actions" and (s.get("with") or {}).get("command") for s in steps(job))
        if not touches_cloud:
            continue
        assert (name, job_id) in CLOUD_JOBS, f"{name}: {job_id} reaches AWS but has no role of its own in CLOUD_JOBS"
        variable, _, _ = CLOUD_JOBS[(name, job_id)]
        condition = str(job.get("if", ""))
        assert re.search(rf"vars\.{variable}\s*!=\s*''", condition), f"{name}: {job_id} must be gated on vars.{variable}"
        assert creds, f"{name}: {job_id} runs Pulumi against the cloud without AWS credentials"
        for step in creds:
            w = step.get("with") or {}
            assert w.get("role-to-assume") == f"${{{{ vars.{variable} }}}}", f"OIDC: assume the job's own role, vars.{variable}"
            assert not {"aws-access-key-id", "aws-secret-access-key"} & set(w), "no stored keys: OIDC only"
            assert w.get("aws-region")


@pytest.mark.parametrize("name", NAMES)
def test_run_scripts_are_valid_bash(name, tmp_path):
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash here")
    for job_id, job in load(name)["jobs"].items():
        for i, step in enumerate(steps(job)):
            if "run" not in step:
                continue
            script = tmp_path / f"{job_id}-{i}.sh"
            script.write_text(_EXPR.sub("EXPR", str(step["run"])))
            proc = subprocess.run([bash, "-n", str(script)], capture_output=True, text=True)
            assert proc.returncode == 0, f"{name}: {job_id}: step {step.get('name', i)}: {proc.stderr}"


# --------------------------------------------------------------------------- hardening: pins, triggers, tokens

# An action is pinned by the full commit SHA (a tag or branch can be moved to other code, a SHA cannot), with
# the release it is in a trailing comment: `uses: owner/repo@<40 hex>  # v1.2.3` (Dependabot keeps both
# current, .github/dependabot.yml). A local action (`./...`) is the repository's own code at the same commit;
# a container action runs only by digest (`docker://image@sha256:<64 hex>`).
_USES_LINE = re.compile(r"""^\s*(?:-\s+)?uses:\s*(?P<q>['"]?)(?P<ref>[^\s'"#]+)(?P=q)(?P<rest>.*)$""")
SHA_PINNED = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_./-]+)?@[0-9a-f]{40}")
DOCKER_PINNED = re.compile(r"docker://[^@\s]+@sha256:[0-9a-f]{64}")
RELEASE_COMMENT = re.compile(r"^\s+#\s*(?P<tag>v\d+\.\d+\.\d+)\s*$")


def pinned_refs(text: str) -> dict[str, str]:
    """Every remote `uses:` of a workflow's text -> the release its trailing comment names ("" when none)."""
    refs = {}
    for line in text.splitlines():
        m = _USES_LINE.match(line)
        if m and not m["ref"].startswith("./"):
            c = RELEASE_COMMENT.match(m["rest"])
            refs[m["ref"]] = c["tag"] if c else ""
    return refs


def pin_problems(text: str) -> list[str]:
    """What in a workflow's text is not pinned as above, one line each (none: all of it is)."""
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        m = _USES_LINE.match(line)
        if not m or m["ref"].startswith("./"):
            continue
        ref, rest = m["ref"], m["rest"]
        if ref.startswith("docker://"):
            if not DOCKER_PINNED.fullmatch(ref):
                problems.append(f"line {n}: {ref} is not pinned by digest (docker://image@sha256:<64 hex>)")
        elif not SHA_PINNED.fullmatch(ref):
            problems.append(f"line {n}: {ref} is not pinned by a full commit SHA (owner/repo@<40 hex>)")
        elif not RELEASE_COMMENT.match(rest):
            problems.append(f"line {n}: {ref} has no trailing `# vX.Y.Z` naming the release of that commit")
    # Whatever YAML reads as a `uses:` must be one the line scan saw (a flow mapping would hide one).
    doc = yaml_text.safe_load(text) or {}
    seen = {m["ref"] for line in text.splitlines() if (m := _USES_LINE.match(line))}
    for job_id, job in (doc.get("jobs") or {}).items():
        for ref in [job.get("uses")] + [s.get("uses") for s in steps(job)]:
            if ref and str(ref) not in seen:
                problems.append(f"{job_id}: `uses: {ref}` is not on a line of its own, so its pin cannot be checked")
    return problems


def environment_name(job: dict) -> str:
    env = job.get("environment")
    return str((env.get("name") if isinstance(env, dict) else env) or "")


def hardening_problems(doc: dict) -> list[str]:
    """Why a workflow would hand out more than its jobs need, one line each (none: it does not).

    No `pull_request_target` (it runs with the base repository's secrets and a write token on a fork's
    event); top-level permissions set and granting no write; every job with `permissions` of its own (a
    mapping: no `write-all`); `id-token: write` only in a job that names its environment, whose protection
    rules (reviewers, branches) then stand between the job and the role that trusts only that environment's
    OIDC subject (ci/README.md).
    """
    problems = []
    if "pull_request_target" in triggers(doc):
        problems.append("runs on pull_request_target: a fork's pull request would run with this repository's "
                        "secrets and a write token; use pull_request")  # fmt: skip
    top = doc.get("permissions")
    if top is None:
        problems.append("no top-level permissions: the default token may write everything; set `permissions: {}`")
    elif not isinstance(top, dict):
        problems.append(f"top-level permissions {top!r}: set `permissions: {{}}` and give each job its own")
    elif any(v == "write" for v in top.values()):
        problems.append(f"top-level permissions grant {sorted(k for k, v in top.items() if v == 'write')} to every "
                        "job: grant writes in the jobs that need them")  # fmt: skip
    for job_id, job in (doc.get("jobs") or {}).items():
        perms = job.get("permissions")
        if perms is None:
            problems.append(f"{job_id}: no permissions of its own (it would get the top level's)")
            continue
        if not isinstance(perms, dict):
            problems.append(f"{job_id}: permissions {perms!r}: list what the job uses")
            continue
        if perms.get("id-token") == "write" and not environment_name(job):
            problems.append(f"{job_id}: id-token: write outside an environment: its OIDC subject would be the "
                            "event's (e.g. every pull request's), which no trust policy can tell apart")  # fmt: skip
    return problems


@pytest.mark.parametrize("name", NAMES)
def test_every_action_is_pinned_by_commit_sha(name):
    text = (WORKFLOWS / name).read_text()
    assert pin_problems(text) == []
    assert pinned_refs(text), f"{name} uses no action?"


def test_each_action_has_one_pin_everywhere():
    """One commit per action across the workflows, and one release comment per commit."""
    by_action: dict[str, set[tuple[str, str]]] = {}
    for name in NAMES:
        for ref, tag in pinned_refs((WORKFLOWS / name).read_text()).items():
            repo, sha = ref.rsplit("@", 1)
            by_action.setdefault(repo, set()).add((sha, tag))
    for repo, pins in by_action.items():
        assert len(pins) == 1, f"{repo} is pinned to different commits or releases: {sorted(pins)}"
    # PULUMI_ACTION_INPUTS above are those of pulumi/actions v7.0.0.
    ((_, tag),) = by_action["pulumi/actions"]
    assert tag == "v7.0.0", "PULUMI_ACTION_INPUTS lists v7.0.0's inputs: check them against the new release's action.yml"


@pytest.mark.parametrize("name", NAMES)
def test_workflow_is_hardened(name):
    assert hardening_problems(load(name)) == []


def test_each_cloud_job_assumes_its_own_role_from_its_own_environment():
    seen = set()
    for name in NAMES:
        text = (WORKFLOWS / name).read_text()
        assert not re.search(r"\bAWS_ROLE_ARN\b", text), f"{name} still reads the shared role AWS_ROLE_ARN"
        for job_id, job in load(name)["jobs"].items():
            if (job.get("permissions") or {}).get("id-token") != "write":
                continue
            assert (name, job_id) in CLOUD_JOBS, f"{name}: {job_id} gets an OIDC token but has no role in CLOUD_JOBS"
            variable, environment, role = CLOUD_JOBS[(name, job_id)]
            seen.add((name, job_id))
            assert environment_name(job) == environment, f"{name}: {job_id} must run in the environment {environment}"
            (creds,) = uses(job, CREDENTIALS_ACTION)
            assert creds["with"]["role-to-assume"] == f"${{{{ vars.{variable} }}}}"
            # The role trusts exactly that environment's OIDC subject.
            trust = json.loads((ROLES_DIR / f"{role}.trust.json").read_text())
            (statement,) = trust["Statement"]
            subject = statement["Condition"]["StringEquals"]["token.actions.githubusercontent.com:sub"]
            assert subject == f"repo:<OWNER>/<REPO>:environment:{environment}", f"{role}.trust.json: {subject}"
    assert seen == set(CLOUD_JOBS), f"jobs in CLOUD_JOBS that no longer assume a role: {set(CLOUD_JOBS) - seen}"
    variables = [v for v, _, _ in CLOUD_JOBS.values()]
    environments = [e for _, e, _ in CLOUD_JOBS.values()]
    assert len(set(variables)) == len(set(environments)) == len(CLOUD_JOBS), "one role and one environment per job"


def test_the_roles_sessions_last_as_long_as_the_jobs_ask():
    """ci/README.md creates each role with a maximum session at least as long as its job's role-duration-seconds."""
    readme = (REPO_ROOT / "ci" / "README.md").read_text()
    for (name, job_id), (_, _, role) in CLOUD_JOBS.items():
        m = re.search(rf"create-role --role-name gpu-serving-ci-{role}\b[^`]*?--max-session-duration (\d+)", readme)
        assert m, f"ci/README.md: no `aws iam create-role --role-name gpu-serving-ci-{role} ... --max-session-duration`"
        (creds,) = uses(load(name)["jobs"][job_id], CREDENTIALS_ACTION)
        wanted = int(creds["with"].get("role-duration-seconds", 3600))
        assert wanted <= int(m.group(1)), f"{name}: {job_id} asks for {wanted} s; gpu-serving-ci-{role} allows {m.group(1)}"


GOOD = """
name: ok
on: pull_request
permissions: {}
jobs:
  build:
    runs-on: ubuntu-latest
    permissions:
      contents: read
    steps:
      - uses: actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803  # v6.1.0
      - uses: ./.github/actions/local
      - uses: docker://alpine@sha256:""" + "a" * 64 + """
      - run: echo ok
  deploy:
    runs-on: ubuntu-latest
    environment: preview
    permissions:
      contents: read
      id-token: write
    steps:
      - run: echo ok
"""


def test_the_pin_check_catches_what_is_not_pinned_by_commit():
    assert pin_problems(GOOD) == []
    checkout = "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803  # v6.1.0"
    bad = {
        "a tag": "actions/checkout@v6",
        "a full version tag": "actions/checkout@v6.1.0  # v6.1.0",
        "a branch": "actions/checkout@main",
        "a short SHA": "actions/checkout@d23441a  # v6.1.0",
        "an upper-case SHA": "actions/checkout@D23441A48E516B6C34AEA4FA41551A30E30AF803  # v6.1.0",
        "no release comment": "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803",
        "a comment that is no release": "actions/checkout@d23441a48e516b6c34aea4fa41551a30e30af803  # latest",
        "a quoted tag": "'actions/checkout@v6'",
        "a docker tag": "docker://alpine:3.20",
        "a docker digest too short": "docker://alpine@sha256:abc",
        "a reusable workflow by branch": "octo/workflows/.github/workflows/ci.yml@main",
    }
    for what, ref in bad.items():
        assert pin_problems(GOOD.replace(checkout, ref)), f"not caught: {what}"
    flow = GOOD.replace("      - run: echo ok\n  deploy:", "      - {uses: actions/setup-python@v6}\n  deploy:")
    assert any("not on a line of its own" in p for p in pin_problems(flow))
    reusable = GOOD + "  call:\n    uses: octo/workflows/.github/workflows/ci.yml@v1\n    permissions: {}\n"
    assert pin_problems(reusable)


def test_the_hardening_check_catches_each_way_to_hand_out_too_much():
    assert hardening_problems(yaml_text.safe_load(GOOD)) == []

    def spoiled(change) -> dict:
        doc = yaml_text.safe_load(GOOD)
        change(doc)
        return doc

    def no_environment(doc):
        del doc["jobs"]["deploy"]["environment"]

    def empty_environment(doc):
        doc["jobs"]["deploy"]["environment"] = {"name": ""}

    def no_job_permissions(doc):
        del doc["jobs"]["build"]["permissions"]

    def write_all_job(doc):
        doc["jobs"]["build"]["permissions"] = "write-all"

    def no_top_permissions(doc):
        del doc["permissions"]

    def top_write(doc):
        doc["permissions"] = {"contents": "write"}

    def top_read_all(doc):
        doc["permissions"] = "read-all"

    def target(doc):
        doc["on"] = {"pull_request_target": {"types": ["opened"]}}

    def target_in_list(doc):
        doc["on"] = ["push", "pull_request_target"]

    def target_alone(doc):
        doc["on"] = "pull_request_target"

    cases = {
        "id-token: write outside an environment": (no_environment, "outside an environment"),
        "an environment without a name": (empty_environment, "outside an environment"),
        "a job without permissions": (no_job_permissions, "no permissions of its own"),
        "a job with write-all": (write_all_job, "list what the job uses"),
        "no top-level permissions": (no_top_permissions, "no top-level permissions"),
        "a write at the top level": (top_write, "grant writes in the jobs"),
        "read-all at the top level": (top_read_all, "top-level permissions 'read-all'"),
        "pull_request_target": (target, "pull_request_target"),
        "pull_request_target in a list": (target_in_list, "pull_request_target"),
        "pull_request_target alone": (target_alone, "pull_request_target"),
    }
    for what, (change, message) in cases.items():
        problems = hardening_problems(spoiled(change))
        assert any(message in p for p in problems), f"not caught: {what}: {problems}"
    # YAML 1.1 reads a bare `on:` as True: a text snippet is caught as well as a parsed mapping.
    text = GOOD.replace("on: pull_request", "on:\n  pull_request_target:\n    branches: [main]")
    assert any("pull_request_target" in p for p in hardening_problems(yaml_text.safe_load(text)))


# --------------------------------------------------------------------------- pull-request.yml


def test_pull_request_offline_job():
    doc = load("pull-request.yml")
    assert set(triggers(doc)) == {"pull_request"}
    assert doc["permissions"] == {}
    offline = doc["jobs"]["offline"]
    assert offline["permissions"] == {"contents": "read", "pull-requests": "write"}  # no OIDC token
    assert "if" not in offline and "environment" not in offline  # every pull request, no credentials, no approval
    checkouts = uses(offline, "actions/checkout")
    refs = {c["with"]["ref"]: c["with"]["path"] for c in checkouts}
    assert refs == {"${{ github.event.pull_request.base.sha }}": "base", "${{ github.event.pull_request.head.sha }}": "head"}
    python = uses(offline, "actions/setup-python")
    assert python and str(python[0]["with"]["python-version"]) == "3.11"
    runs = [s for s in steps(offline) if "run" in s]
    assert any(s["run"].strip() == "bin/test" and s.get("working-directory") == "head" for s in runs)
    report = next(s for s in runs if s.get("id") == "report")["run"]
    calls = infra_calls(report)
    assert ["synth", "--stack", "$stack", "--out", "../out/head-$stack.json"] in calls
    assert ["synth", "--stack", "$stack", "--out", "../out/base-$stack.json"] in calls
    assert ["diff", "../out/base-$stack.json", "../out/head-$stack.json"] in calls
    assert ["check", "--stack", "$stack"] in calls
    assert ["scan", "--stack", "$stack", "--markdown", "../out/scan-$stack.md"] in calls
    assert "for stack in prod test" in report
    # One sticky comment, updated in place, holding both the diff and the policy results.
    comment = uses(offline, "actions/github-script")
    assert len(comment) == 1
    script = comment[0]["with"]["script"]
    assert "<!-- gpu-serving:pull-request-report -->" in report and "<!-- gpu-serving:pull-request-report -->" in script
    assert "updateComment" in script and "createComment" in script
    assert "always()" in comment[0]["if"] and "head.repo.full_name == github.repository" in comment[0]["if"]
    # The job fails after posting when the head does not synthesize or breaks a rule.
    last = steps(offline)[-1]
    assert last.get("if") == "steps.report.outputs.failed != '0'" and "exit 1" in last["run"]


def test_pull_request_preview_job_uses_the_pulumi_action_with_the_policy_pack():
    doc = load("pull-request.yml")
    preview = doc["jobs"]["preview"]
    assert preview["permissions"] == {"contents": "read", "pull-requests": "write", "id-token": "write"}
    assert "head.repo.full_name == github.repository" in preview["if"]  # forks get neither OIDC nor secrets
    # The pull request's own program and policy pack run with the preview role: only after the `preview`
    # environment's reviewers approve, and only after the offline job passed.
    assert environment_name(preview) == "preview" and preview["needs"] == "offline"
    (step,) = uses(preview, "pulumi/actions")
    w = step["with"]
    assert not set(w) - PULUMI_ACTION_INPUTS, f"unknown pulumi/actions inputs: {set(w) - PULUMI_ACTION_INPUTS}"
    assert w["command"] == "preview" and w["stack-name"] == "prod"
    assert w["diff"] is True and w["comment-on-pr"] is True
    assert w["policyPacks"] == "policies"
    assert step["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    order = [action(s) or "run" for s in steps(preview)]
    assert order.index(CREDENTIALS_ACTION) < order.index("pulumi/actions")
    pack = REPO_ROOT / "policies"
    if pack.is_dir():
        assert (pack / "PulumiPolicy.yaml").is_file(), "policyPacks: policies needs policies/PulumiPolicy.yaml"


# --------------------------------------------------------------------------- ephemeral.yml


def test_ephemeral_workflow_runs_up_test_and_always_down():
    doc = load("ephemeral.yml")
    on = triggers(doc)
    assert "workflow_dispatch" in on and on["pull_request"]["types"] == ["labeled"]
    assert doc["permissions"] == {}
    assert "github.event.pull_request.number" in doc["concurrency"]["group"]
    assert doc["concurrency"]["cancel-in-progress"] is False  # never cancel a teardown
    (job,) = doc["jobs"].values()
    assert job["permissions"] == {"contents": "read", "id-token": "write"}
    assert environment_name(job) == "ephemeral"
    assert "github.event.label.name == 'ephemeral-test'" in job["if"]
    assert "head.repo.full_name == github.repository" in job["if"]
    assert job["env"]["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    order = []
    for step in steps(job):
        for call in infra_calls(str(step.get("run", ""))):
            if call[0] == "ephemeral":
                order.append((call[1], step))
    assert [verb for verb, _ in order] == ["up", "test", "down"]
    up_step, test_step, down_step = (s for _, s in order)
    assert down_step.get("if") == "always()"
    assert "if" not in up_step and "if" not in test_step
    budget = sum(s["timeout-minutes"] for s in (up_step, test_step, down_step))
    assert budget < job["timeout-minutes"], "the step timeouts must leave the job time for `down`"
    names = [action(s) or "run" for s in steps(job)]
    assert names.index("pulumi/actions") < names.index("run", names.index(CREDENTIALS_ACTION))
    (install,) = uses(job, "pulumi/actions")
    assert "command" not in (install.get("with") or {})  # installs the CLI only; the Automation API drives it
    (creds,) = uses(job, CREDENTIALS_ACTION)
    assert int(creds["with"]["role-duration-seconds"]) >= budget * 60
    # The hosted runner reaches the API: the copy's endpoint is public-restricted to the runner's own address,
    # read at run time, and `up` gets it as --deployer-cidr.
    (egress,) = [s for s in steps(job) if s.get("id") == "egress"]
    assert "checkip.amazonaws.com" in egress["run"] and 'cidr=$ip/32' in egress["run"] and "GITHUB_OUTPUT" in egress["run"]
    assert steps(job).index(egress) < steps(job).index(up_step)
    assert up_step["env"]["DEPLOYER_CIDR"] == "${{ steps.egress.outputs.cidr }}"
    (up_call,) = [c for c in infra_calls(up_step["run"]) if c[:2] == ["ephemeral", "up"]]
    assert up_call[up_call.index("--deployer-cidr") + 1] == "$DEPLOYER_CIDR"


def _steps_calling(job: dict, *command: str) -> list[dict]:
    return [s for s in steps(job) if any(c[: len(command)] == list(command) for c in infra_calls(str(s.get("run", ""))))]


def preflight_gate_problems(job: dict) -> list[str]:
    """Why `python -m infra preflight` would not stop the job before `ephemeral up`, one line each (none: it does).

    The step must run after the AWS credentials and before `up`, on the stack file `up` copies, without
    --allow-unknown; its failure must fail the job: no continue-on-error (step or job), no `if:` on it or on `up`
    (`up` then runs only after success), and its exit status must reach the runner (one command, no pipe, `||`
    or `;`: GitHub runs a `run` script with `bash -e`, which a pipe without pipefail or an `||` defeats).
    """
    pre, up = _steps_calling(job, "preflight"), _steps_calling(job, "ephemeral", "up")
    if len(pre) != 1 or len(up) != 1:
        return [f"want one pre-flight step and one `ephemeral up` step; found {len(pre)} and {len(up)}"]
    (pre,), (up,) = pre, up
    problems = []
    order = steps(job)
    creds = uses(job, CREDENTIALS_ACTION)
    if not creds or not order.index(creds[0]) < order.index(pre) < order.index(up):
        problems.append("pre-flight must run after the AWS credentials and before `ephemeral up`")
    (call,) = [c for c in infra_calls(pre["run"]) if c[0] == "preflight"]
    (up_call,) = [c for c in infra_calls(up["run"]) if c[:2] == ["ephemeral", "up"]]
    stack = call[call.index("--stack") + 1] if "--stack" in call else None
    source = up_call[up_call.index("--from") + 1] if "--from" in up_call else None
    if stack is None or stack != source:
        problems.append(f"pre-flight checks --stack {stack}, `up` copies --from {source}")
    if "--allow-unknown" in call:
        problems.append("pre-flight passes --allow-unknown: an unknown would not stop `up`")
    for where, holder in (("step", pre), ("job", job)):
        if holder.get("continue-on-error"):
            problems.append(f"continue-on-error on the {where}: a failed pre-flight would not fail the job")
    for name, step in (("pre-flight", pre), ("up", up)):
        if "if" in step:
            problems.append(f"`if: {step['if']}` on {name}: `up` must run only after pre-flight succeeded")
    lines = [ln.strip() for ln in pre["run"].strip().splitlines() if ln.strip()]
    if len(lines) != 1 or not lines[0].startswith("venv/bin/python -m infra preflight") or re.search(r"[|;&]", lines[0]):
        problems.append(f"the pre-flight script must be the one command, its exit status the step's: {pre['run']!r}")
    if pre.get("shell") not in (None, "bash"):
        problems.append(f"shell {pre['shell']!r}: the default bash -e is what fails the step")
    return problems


def test_ephemeral_workflow_runs_preflight_before_up_and_fails_when_it_fails():
    doc = load("ephemeral.yml")
    (job,) = doc["jobs"].values()
    assert preflight_gate_problems(job) == []
    (pre,) = _steps_calling(job, "preflight")
    assert isinstance(pre.get("timeout-minutes"), int)
    gated = [("preflight",), ("ephemeral", "up"), ("ephemeral", "test"), ("ephemeral", "down")]
    budget = sum(_steps_calling(job, *c)[0]["timeout-minutes"] for c in gated)
    assert budget < job["timeout-minutes"], "pre-flight must leave `down` its time too"


def test_the_preflight_gate_check_catches_a_job_that_goes_on():
    doc = load("ephemeral.yml")
    (job,) = doc["jobs"].values()
    (pre,) = _steps_calling(job, "preflight")
    i = steps(job).index(pre)
    (up,) = _steps_calling(job, "ephemeral", "up")
    j = steps(job).index(up)

    def with_step(index: int, **change) -> dict:
        new = [dict(s) for s in steps(job)]
        new[index].update(change)
        return {**job, "steps": new}

    spoiled = {
        "continue-on-error on the step": with_step(i, **{"continue-on-error": True}),
        "continue-on-error on the job": {**job, "continue-on-error": True},
        "|| true": with_step(i, run=pre["run"].rstrip() + " || true"),
        "a pipe": with_step(i, run=pre["run"].rstrip() + " | tee preflight.txt"),
        "always()": with_step(i, **{"if": "always()"}),
        "up regardless": with_step(j, **{"if": "always()"}),
        "allow unknown": with_step(i, run=pre["run"].rstrip() + " --allow-unknown"),
        "another stack": with_step(i, run="venv/bin/python -m infra preflight --stack prod"),
        "after up": {**job, "steps": [s for s in steps(job) if s is not pre] + [pre]},
        "gone": {**job, "steps": [s for s in steps(job) if s is not pre]},
    }
    for what, bad in spoiled.items():
        assert preflight_gate_problems(bad), f"not caught: {what}"


# --------------------------------------------------------------------------- nightly-sweep.yml


def test_nightly_sweep_is_scheduled_and_keeps_its_report():
    doc = load("nightly-sweep.yml")
    on = triggers(doc)
    assert "workflow_dispatch" in on
    (cron,) = [s["cron"] for s in on["schedule"]]
    fields = cron.split()
    assert len(fields) == 5 and fields[2:] == ["*", "*", "*"], f"nightly: {cron}"
    (job,) = doc["jobs"].values()
    assert doc["permissions"] == {} and job["permissions"] == {"contents": "read", "id-token": "write"}
    assert environment_name(job) == "sweeper"  # its deployment branches: the default branch only (ci/README.md)
    sweep_calls = [c for s in steps(job) for c in infra_calls(str(s.get("run", ""))) if c[0] == "sweep"]
    assert ["sweep", "--yes", "${regions[@]}"] in sweep_calls  # delete on the schedule
    run = next(s["run"] for s in steps(job) if "infra sweep" in str(s.get("run", "")))
    assert "--region" in run and "tee sweep-report.txt" in run
    (upload,) = uses(job, "actions/upload-artifact")
    assert upload["if"] == "always()" and upload["with"]["path"] == "sweep-report.txt"
    assert "github.event_name == 'schedule'" in job["env"]["SWEEP_DELETE"]
