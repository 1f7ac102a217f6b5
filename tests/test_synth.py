"""Offline synth (`infra.preview.synth`, `python -m infra synth`).

The real program runs in-process under the recording engine for each stack
file; a small program of our own (written to a temporary project) pins down the
document's form: options, placeholders for values only the cloud knows,
secrets, integers.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pulumi
import pytest
from pulumi.runtime import settings

from infra.errors import UserError
from infra.preview.synth import COMPUTED, SECRET, dump, synthesize
from tests import cli_in_process

PROJECT_YAML = "name: synth-demo\nruntime: python\n"

DEMO_PROGRAM = '''
import pulumi
import pulumi_aws as aws

cfg = pulumi.Config()


async def _nothing():
    return None


async def _no():
    return False


# A value nobody knows before the deployment (what a preview shows as "known after apply").
unknown = pulumi.Output(set(), _nothing(), _no())

vpc = aws.ec2.Vpc(
    "vpc",
    cidr_block=cfg.get("cidr") or "10.0.0.0/16",
    tags={"Name": "demo", "kubernetes.io/role/internal-elb": "1"},
    opts=pulumi.ResourceOptions(protect=True, ignore_changes=["tags"], retain_on_delete=True),
)
sg = aws.ec2.SecurityGroup("efa", vpc_id=vpc.id, description=unknown)
nodes = aws.eks.NodeGroup(
    "gpu",
    cluster_name="demo",
    node_role_arn="arn:aws:iam::123456789012:role/node",
    subnet_ids=[vpc.id],
    ami_type="AL2023_x86_64_NVIDIA",
    instance_types=[cfg.get("instanceType") or "p5.48xlarge"],
    scaling_config=aws.eks.NodeGroupScalingConfigArgs(desired_size=cfg.require_int("nodes"), min_size=0, max_size=8),
    labels={"token": pulumi.Output.secret("s3cr3t")},
    opts=pulumi.ResourceOptions(
        depends_on=[vpc],
        replace_on_changes=["instance_types"],
        custom_timeouts=pulumi.CustomTimeouts(create="90m"),
        aliases=[pulumi.Alias(name="gpu-old")],
    ),
)
pulumi.export("vpcId", vpc.id)
pulumi.export("nodes", cfg.require_int("nodes"))
pulumi.export("nodeGroupArn", nodes.arn)
pulumi.export("token", pulumi.Output.secret("hush"))
pulumi.export("ratio", 0.5)
'''


def write_project(root: Path, program: str, stacks: dict[str, str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Pulumi.yaml").write_text(PROJECT_YAML)
    (root / "__main__.py").write_text(textwrap.dedent(program))
    for stack, config in stacks.items():
        (root / f"Pulumi.{stack}.yaml").write_text(textwrap.dedent(config))
    return root


@pytest.fixture
def demo(tmp_path: Path) -> Path:
    return write_project(
        tmp_path / "demo",
        DEMO_PROGRAM,
        {"dev": "config:\n  aws:region: us-east-1\n  synth-demo:nodes: 3\n"},
    )


@functools.lru_cache(maxsize=None)
def _synthesized(stack: str, root: Path) -> str:
    return dump(synthesize(stack, root))


def synthesized(stack: str, root: Path) -> dict:
    """The repository's `stack` as synthesised once in this process (a fresh copy each call): the tests that
    only read the document share it; the determinism test compares it with a synthesis of its own."""
    return json.loads(_synthesized(stack, root))


def by_name(doc: dict, name: str) -> dict:
    (found,) = [r for r in doc["resources"] if r["name"] == name]
    return found


# -- the real program ------------------------------------------------------------


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_stack_synthesises_deterministically(stack: str, repo_root: Path) -> None:
    first = dump(synthesized(stack, repo_root))  # an earlier run in this process (shared with the tests that read it)
    second = dump(synthesize(stack, repo_root))
    assert first == second
    doc = json.loads(first)
    assert doc == json.loads(json.dumps(doc))  # plain JSON all the way down
    assert doc["project"] == "gpu-serving" and doc["stack"] == stack
    assert set(doc) == {"project", "stack", "resources", "outputs"}
    urns = [r["urn"] for r in doc["resources"]]
    assert urns == sorted(urns) and len(set(urns)) == len(urns)
    assert all(r["type"] != "pulumi:pulumi:Stack" for r in doc["resources"])
    for r in doc["resources"]:
        assert set(r) == {"type", "name", "urn", "parent", "custom", "inputs", "options"}
        assert r["urn"].startswith(f"urn:pulumi:{stack}::gpu-serving::") and r["urn"].endswith("::" + r["name"])
        assert list(r["inputs"]) == sorted(r["inputs"])
        assert r["parent"].startswith(f"urn:pulumi:{stack}::gpu-serving::")

    # The outputs the program exports, resolved: the plan and its key figures.
    outputs = doc["outputs"]
    plan = outputs["plan"]
    assert plan["feasible"] is True
    for key in ("model", "instanceType", "nodes", "tensorParallel", "pipelineParallel", "kvCacheTokens",
                "maxConcurrency", "vllmArgs", "hourlyCostUsd", "monthlyCostUsd"):  # fmt: skip
        assert key in outputs, key
    assert outputs["nodes"] == plan["layout"]["nodes"] and isinstance(outputs["nodes"], int)
    assert outputs["tensorParallel"] == plan["layout"]["tp"]
    assert outputs["vllmArgs"] == plan["vllm_args"]
    # A secret export is never written out.
    for value in outputs.values():
        if isinstance(value, dict) and "<secret>" in value:
            assert value == SECRET


def test_same_bytes_across_processes_and_hash_seeds(repo_root: Path) -> None:
    import os

    from infra.planning.capacity_cache import ENV

    # Seed 1 plans from scratch (without the run's shared SLA capacities); seed 2 reads them.
    fresh = {k: v for k, v in os.environ.items() if k != ENV}
    outputs = set()
    for seed, env in (("1", fresh), ("2", os.environ)):
        done = subprocess.run(
            [sys.executable, "-m", "infra", "synth", "--stack", "prod"],
            cwd=repo_root, capture_output=True, text=True, timeout=300,
            env={**env, "PYTHONHASHSEED": seed},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert outputs == {dump(synthesized("prod", repo_root))}


def test_prod_node_groups_and_cluster_are_in_the_document(repo_root: Path) -> None:
    doc = synthesized("prod", repo_root)
    types = {r["type"] for r in doc["resources"]}
    if "aws:eks/nodeGroup:NodeGroup" not in types:
        pytest.skip("the program declares no node group yet")
    gpu = [r for r in doc["resources"] if r["type"] == "aws:eks/nodeGroup:NodeGroup" and "NVIDIA" in r["inputs"].get("amiType", "")]
    assert gpu, "no GPU node group in prod"
    scaling = gpu[0]["inputs"]["scalingConfig"]
    assert scaling["desiredSize"] == doc["outputs"]["nodes"] and type(scaling["desiredSize"]) is int


def _computed_paths(value, path: str = "") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _computed_paths(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _computed_paths(v, f"{path}[{i}]")]
    return [path] if value == COMPUTED else []


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_no_input_refers_to_an_output_the_engine_dropped(stack: str, repo_root: Path) -> None:
    # Declared outputs nothing computes are answered as unknown, so an input built from one would be <computed>.
    doc = synthesized(stack, repo_root)
    unknown = [f"{r['name']}{p}" for r in doc["resources"] for p in _computed_paths(r["inputs"])]
    assert unknown == [], unknown
    assert _computed_paths(doc["outputs"]) == []
    # The NAT gateways get their elastic IPs' allocation ids, a stable placeholder derived from the EIP.
    nats = [r for r in doc["resources"] if r["type"] == "aws:ec2/natGateway:NatGateway"]
    assert nats
    for nat in nats:
        assert nat["inputs"]["allocationId"] == f"<allocation-id:{nat['name']}-eip>"


def test_declared_outputs_are_answered(tmp_path: Path) -> None:
    from infra.preview.recording import record

    seen: dict = {}

    def program() -> None:
        import pulumi_aws as aws

        sg = aws.ec2.SecurityGroup("g", vpc_id="vpc-1")
        key = aws.kms.Key("k")
        pulumi.Output.all(sg.owner_id, key.key_usage, sg.ingress).apply(lambda v: seen.update(owner=v[0], usage=v[1]))
        aws.ec2.SecurityGroup("h", vpc_id="vpc-1", description=sg.ingress.apply(lambda v: str(v)))

    rec = record(program)
    assert seen == {}  # `ingress` (a list) is computed by nobody here: unknown, so the apply never ran
    assert ("aws:ec2/securityGroup:SecurityGroup", "g", "ingress") in rec.unknown_outputs
    from infra.preview.synth import plain

    assert plain(rec.named("h").inputs)["description"] == COMPUTED  # what a synth shows for it
    seen.clear()

    def strings() -> None:
        import pulumi_aws as aws

        sg = aws.ec2.SecurityGroup("g", vpc_id="vpc-1")
        pulumi.Output.all(sg.owner_id, sg.vpc_id).apply(lambda v: seen.update(owner=v[0], vpc=v[1]))

    record(strings)
    assert seen == {"owner": "<ownerId:g>", "vpc": "vpc-1"}  # a string output: a placeholder; an input: itself


def test_the_sdk_class_of_a_type_token_is_the_one_its_package_registers() -> None:
    import pulumi_aws  # noqa: F401 - importing a package registers its modules
    import pulumi_kubernetes  # noqa: F401

    from infra.preview.recording import _output_properties, sdk_class_path

    assert sdk_class_path("aws:ec2/eip:Eip") == "pulumi_aws.ec2.Eip"
    assert sdk_class_path("kubernetes:core/v1:Namespace") == "pulumi_kubernetes.core.v1.Namespace"
    # API groups whose Python module is not their name: networking.k8s.io is `networking`, helm.sh is `helm`.
    assert sdk_class_path("kubernetes:networking.k8s.io/v1:NetworkPolicy") == "pulumi_kubernetes.networking.v1.NetworkPolicy"
    assert sdk_class_path("kubernetes:helm.sh/v3:Release") == "pulumi_kubernetes.helm.v3.Release"
    assert sdk_class_path("kubernetes:ray.io/v1:RayCluster") is None  # a custom resource: no class of its own
    assert sdk_class_path("gpu-serving:network:Network") is None  # a component
    # So their declared outputs are answered too.
    assert "status" in _output_properties("kubernetes:networking.k8s.io/v1:NetworkPolicy")
    assert "status" in _output_properties("kubernetes:helm.sh/v3:Release")


def test_runtime_state_is_reset_after_a_run(repo_root: Path) -> None:
    synthesize("test", repo_root)
    assert settings.get_root_resource() is None
    assert settings.SETTINGS.monitor is None
    assert pulumi.runtime.config.CONFIG.get() == {}


def test_the_sdks_stack_walk_is_left_out_of_a_run_only_and_nothing_recorded_came_from_it(demo: Path, monkeypatch) -> None:
    import pulumi.runtime.resource as runtime_resource

    from infra.preview import recording

    walk = runtime_resource._get_stack_trace
    # The pinned SDK looks the walk up by name at each registration and read, so the swap takes effect.
    assert "_get_stack_trace" in runtime_resource.register_resource.__code__.co_names
    assert "_get_stack_trace" in runtime_resource.read_resource.__code__.co_names
    calls, empty = [], recording.no_stack_trace
    monkeypatch.setattr(recording, "no_stack_trace", lambda: calls.append(1) or empty())
    without = synthesize("dev", demo)
    assert len(calls) >= len(without["resources"]) == 3  # one per registration, none walked
    assert runtime_resource._get_stack_trace is walk  # put back after the run
    monkeypatch.setattr(recording, "no_stack_trace", walk)  # the SDK's own walk: the same document
    assert dump(synthesize("dev", demo)) == dump(without)


# -- a program of our own --------------------------------------------------------


def test_custom_program_records_options_placeholders_and_numbers(demo: Path) -> None:
    doc = synthesize("dev", demo)
    assert doc["project"] == "synth-demo" and doc["stack"] == "dev"
    assert [r["name"] for r in doc["resources"]] == ["efa", "vpc", "gpu"]  # sorted by URN: type, then name

    vpc = by_name(doc, "vpc")
    assert vpc["type"] == "aws:ec2/vpc:Vpc"
    assert vpc["urn"] == "urn:pulumi:dev::synth-demo::aws:ec2/vpc:Vpc::vpc"
    assert vpc["parent"] == "urn:pulumi:dev::synth-demo::pulumi:pulumi:Stack::synth-demo-dev"
    assert vpc["custom"] is True
    assert vpc["inputs"] == {
        "cidrBlock": "10.0.0.0/16",
        "tags": {"Name": "demo", "kubernetes.io/role/internal-elb": "1"},
    }
    assert vpc["options"]["protect"] is True
    assert vpc["options"]["retain_on_delete"] is True
    assert vpc["options"]["ignore_changes"] == ["tags"]

    # A value only the cloud knows: the recording engine's stable placeholder ...
    ng = by_name(doc, "gpu")
    assert ng["inputs"]["subnetIds"] == ["<id:vpc>"]
    # ... and a value unknown before deployment.
    assert by_name(doc, "efa")["inputs"]["description"] == COMPUTED
    # Secrets are marked, never written.
    assert ng["inputs"]["labels"] == SECRET
    assert "s3cr3t" not in dump(doc)
    # Integers stay integers (the wire format carries doubles).
    assert ng["inputs"]["scalingConfig"] == {"desiredSize": 3, "maxSize": 8, "minSize": 0}
    assert all(type(v) is int for v in ng["inputs"]["scalingConfig"].values())

    opts = ng["options"]
    assert opts["depends_on"] == [vpc["urn"]]
    assert opts["replace_on_changes"] == ["instanceTypes"]
    assert opts["custom_timeouts"] == {"create": "90m"}
    assert opts["aliases"] == ["urn:pulumi:dev::synth-demo::aws:eks/nodeGroup:NodeGroup::gpu-old"]
    assert opts["protect"] is False and opts["delete_before_replace"] is False
    assert set(opts) == {
        "protect", "retain_on_delete", "delete_before_replace", "ignore_changes", "replace_on_changes",
        "depends_on", "provider", "aliases", "additional_secret_outputs", "custom_timeouts",
    }  # fmt: skip

    assert doc["outputs"] == {
        "vpcId": "<id:vpc>",
        "nodes": 3,
        "nodeGroupArn": "<arn:gpu>",
        "token": SECRET,
        "ratio": 0.5,
    }
    assert type(doc["outputs"]["nodes"]) is int
    assert dump(synthesize("dev", demo)) == dump(doc)


def test_components_nest_in_urns(tmp_path: Path) -> None:
    program = '''
    import pulumi
    import pulumi_aws as aws

    class Net(pulumi.ComponentResource):
        def __init__(self, name, opts=None):
            super().__init__("demo:net:Net", name, None, opts)
            self.vpc = aws.ec2.Vpc(f"{name}-vpc", cidr_block="10.1.0.0/16", opts=pulumi.ResourceOptions(parent=self))
            self.register_outputs({"vpcId": self.vpc.id})

    net = Net("net")
    pulumi.export("vpcId", net.vpc.id)
    '''
    root = write_project(tmp_path / "nested", program, {"dev": "config: {}\n"})
    doc = synthesize("dev", root)
    (comp,) = [r for r in doc["resources"] if r["type"] == "demo:net:Net"]
    (vpc,) = [r for r in doc["resources"] if r["type"] == "aws:ec2/vpc:Vpc"]
    assert comp["custom"] is False and comp["inputs"] == {}
    assert comp["urn"] == "urn:pulumi:dev::synth-demo::demo:net:Net::net"
    assert vpc["urn"] == "urn:pulumi:dev::synth-demo::demo:net:Net$aws:ec2/vpc:Vpc::net-vpc"
    assert vpc["parent"] == comp["urn"]
    assert doc["outputs"] == {"vpcId": "<id:net-vpc>"}


def test_program_errors_become_user_errors(tmp_path: Path) -> None:
    program = '''
    import pulumi
    cfg = pulumi.Config()
    if cfg.require_int("nodes") > 2:
        raise pulumi.RunError("stack dev: 3 nodes do not fit the reservation of 2")
    '''
    root = write_project(tmp_path / "err", program, {"dev": "config:\n  synth-demo:nodes: 3\n", "bad": "config:\n  synth-demo:nodes: many\n"})
    with pytest.raises(UserError, match="3 nodes do not fit the reservation of 2"):
        synthesize("dev", root)
    with pytest.raises(UserError, match="nodes"):
        synthesize("bad", root)  # pulumi.ConfigTypeError is a RunError
    with pytest.raises(UserError, match="no stack file Pulumi.nope.yaml"):
        synthesize("nope", root)
    with pytest.raises(UserError, match="no Pulumi.yaml"):
        synthesize("dev", tmp_path)
    # Nothing leaks into the next run.
    assert settings.get_root_resource() is None
    assert synthesize("dev", write_project(tmp_path / "ok", "import pulumi\npulumi.export('x', 1)\n", {"dev": "config: {}\n"}))["outputs"] == {"x": 1}


def test_a_bug_in_the_program_keeps_its_traceback(tmp_path: Path) -> None:
    root = write_project(tmp_path / "bug", "x = 1 / 0\n", {"dev": "config: {}\n"})
    with pytest.raises(ZeroDivisionError):
        synthesize("dev", root)
    assert settings.get_root_resource() is None


# -- the command line ------------------------------------------------------------


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infra", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_cli_writes_the_document(demo: Path, repo_root: Path, tmp_path: Path) -> None:
    # In-process (tests/cli_in_process.py); the fresh `python -m infra synth` processes are the hash-seed
    # test's (exit 0, the document on stdout) and the config error's (exit 2, one line).
    out = tmp_path / "dev.json"
    done = cli_in_process.invoke("synth", "--stack", "dev", "--root", str(demo), "--out", str(out), expect=None)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    assert out.read_text() == dump(synthesize("dev", demo))
    to_stdout = cli_in_process.invoke("synth", "--stack", "dev", "--root", str(demo), expect=None)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout == out.read_text()


def test_cli_config_error_is_one_line_and_exit_2(repo_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "bad"
    root.mkdir()
    (root / "Pulumi.yaml").write_text((repo_root / "Pulumi.yaml").read_text())
    (root / "__main__.py").write_text((repo_root / "__main__.py").read_text())
    prod = (repo_root / "Pulumi.prod.yaml").read_text()
    assert "gpuMemoryUtilization: 0.90" in prod
    (root / "Pulumi.bad.yaml").write_text(prod.replace("gpuMemoryUtilization: 0.90", "gpuMemoryUtilization: 1.2"))

    done = run_cli("synth", "--stack", "bad", "--root", str(root), cwd=repo_root)
    assert done.returncode == 2
    assert done.stdout == ""
    err = done.stderr.strip()
    assert "\n" not in err, err
    assert err.startswith("error:")
    assert "gpu-serving:serving.gpuMemoryUtilization = 1.2 is out of range" in err
    assert "Traceback" not in done.stderr


def test_cli_multi_line_program_message_is_one_line(tmp_path: Path, repo_root: Path) -> None:
    program = '''
    import pulumi
    raise pulumi.RunError("no feasible plan:\\n  - too little memory\\n  - too few nodes")
    '''
    root = write_project(tmp_path / "multi", program, {"dev": "config: {}\n"})
    done = cli_in_process.invoke("synth", "--stack", "dev", "--root", str(root), expect=None)  # in-process, as above
    assert done.returncode == 2
    assert done.stderr.strip() == "error: no feasible plan: too little memory; too few nodes"
