"""The deployer's way into the cluster API, per endpoint mode, through the real program.

For each mode of `gpu-serving:cluster.endpointAccess` the program runs under the
recording engine (preview off, so every `apply` runs and the stack outputs are
resolved) and the test reads what the deployer depends on: the cluster's
endpoint settings, the security group rules and bastion that open the way, and
the kubeconfig the stack exports. The combinations that leave the deployer out
are refused before any resource is registered, with one message that names the
key and the fix. The kubeconfig document and the tunnel command are checked
against the field names of client-go's kubeconfig and the SSM port-forwarding
document (infra/aws/access.py names the sources).
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
from functools import lru_cache
from pathlib import Path

import botocore.session
import pulumi
import pytest
from pulumi.runtime.rpc import is_rpc_secret, unwrap_rpc_secret

from infra.aws import access
from infra.config import engine_config
from infra.preview.recording import STACK_TYPE, Recording, placeholder, record
from tests.synthesized import repo_stack

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "aws:eks/cluster:Cluster"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
EGRESS = "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule"
INSTANCE = "aws:ec2/instance:Instance"
K8S_PROVIDER = "pulumi:providers:kubernetes"
ENDPOINT_HOST = placeholder("endpoint", "gpu-serving-test-eks")
EXISTING = {
    "existingVpcId": "vpc-0123456789abcdef0",
    "existingPrivateSubnetIds": ["subnet-0aaaaaaaaaaaaaaaa", "subnet-0bbbbbbbbbbbbbbbb"],
    "existingGpuSubnetId": "subnet-0cccccccccccccccc",
}


def _config(cluster: dict, network: dict | None = None) -> dict[str, str]:
    config = dict(engine_config("test", REPO))
    area = json.loads(config.get("gpu-serving:cluster", "{}"))
    area.update(cluster)
    config["gpu-serving:cluster"] = json.dumps(area)
    if network is not None:
        net = json.loads(config.get("gpu-serving:network", "{}"))
        net.update(network)
        config["gpu-serving:network"] = json.dumps(net)
    return config


def _run(config: dict[str, str], into: Recording | None = None) -> Recording:
    return record(lambda: runpy.run_path(str(REPO), run_name="__main__"), stack="test", config=config, into=into)


@lru_cache(maxsize=None)
def _mode(mode: str) -> Recording:
    if mode == access.PUBLIC_RESTRICTED:
        return _run(_config({"endpointAccess": mode, "deployerCidrs": ["198.51.100.7/32"]}))
    if mode == access.PRIVATE_VPC:
        return _run(_config({"endpointAccess": mode, "deployerCidrs": ["10.20.0.0/24"]}, EXISTING))
    return _run(_config({"endpointAccess": mode}))


def _kubeconfig(rec: Recording) -> dict:
    raw = rec.outputs["kubeconfig"]
    assert is_rpc_secret(raw), "the exported kubeconfig must stay a secret"
    return json.loads(unwrap_rpc_secret(raw))


def _vpc_config(rec: Recording) -> dict:
    return rec.one(CLUSTER).inputs["vpcConfig"]


def _api_rules(rec: Recording) -> list[dict]:
    sg = placeholder("cluster-sg", "gpu-serving-test-eks")
    return [r.inputs for r in rec.of_type(INGRESS) if r.inputs["securityGroupId"] == sg]


def _provider_waits_for(rec: Recording) -> set[str]:
    return {u.rsplit("::", 1)[-1] for u in rec.one(K8S_PROVIDER).options["depends_on"]}


def test_public_restricted_opens_the_public_endpoint_to_the_deployer_only():
    rec = _mode(access.PUBLIC_RESTRICTED)
    vpc = _vpc_config(rec)
    assert (vpc["endpointPublicAccess"], vpc["endpointPrivateAccess"]) == (True, True)  # nodes stay inside the VPC
    assert vpc["publicAccessCidrs"] == ["198.51.100.7/32"]
    assert _api_rules(rec) == [] and rec.of_type(INSTANCE) == []  # no bastion, no extra rule
    cluster = _kubeconfig(rec)["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://{ENDPOINT_HOST}"  # straight to the public endpoint
    assert "tls-server-name" not in cluster and "extensions" not in cluster


def test_private_ssm_gives_a_bastion_a_rule_and_a_tunnelled_kubeconfig():
    rec = _mode(access.PRIVATE_SSM)
    vpc = _vpc_config(rec)
    assert (vpc["endpointPublicAccess"], vpc["endpointPrivateAccess"]) == (False, True)
    assert "publicAccessCidrs" not in vpc

    (bastion,) = rec.of_type(INSTANCE)
    assert bastion.inputs["associatePublicIpAddress"] is False
    assert bastion.inputs["subnetId"] == placeholder("id", "gpu-serving-test-private-us-east-1a")  # a private subnet
    assert bastion.inputs["metadataOptions"]["httpTokens"] == "required"
    template = rec.named("gpu-serving-test-bastion-lt").inputs
    assert template["imageId"] == access.BASTION_IMAGE and template["imageId"].startswith("resolve:ssm:")
    assert template["iamInstanceProfile"]["arn"] == placeholder("arn", "gpu-serving-test-bastion-profile")
    group = placeholder("id", "gpu-serving-test-bastion-sg")
    assert template["vpcSecurityGroupIds"] == [group]
    # Once named like the instance: the aliases keep a deployed profile and group (a rename, not a replacement).
    for renamed in ("gpu-serving-test-bastion-profile", "gpu-serving-test-bastion-sg"):
        r = rec.named(renamed)
        assert r.options["aliases"] == [r.urn.rsplit("::", 1)[0] + "::gpu-serving-test-bastion"]
    # Detailed monitoring on the instance (switched on in place), the template untouched (a new version replaces the bastion).
    assert bastion.inputs["monitoring"] is True and "monitoring" not in template and "ebsOptimized" not in template
    policy = rec.named("gpu-serving-test-bastion-AmazonSSMManagedInstanceCore").inputs["policyArn"]
    assert policy == "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
    # No inbound rule on the bastion at all; HTTPS out; 443 on the cluster security group from it.
    assert [r for r in rec.of_type(INGRESS) if r.inputs["securityGroupId"] == group] == []
    (out,) = [r.inputs for r in rec.of_type(EGRESS) if r.inputs["securityGroupId"] == group]
    assert (out["ipProtocol"], out["fromPort"], out["toPort"]) == ("tcp", 443, 443)
    (rule,) = _api_rules(rec)
    assert rule["referencedSecurityGroupId"] == group and (rule["fromPort"], rule["toPort"]) == (443, 443)

    config = _kubeconfig(rec)
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == "https://localhost:9443"
    assert cluster["tls-server-name"] == ENDPOINT_HOST  # the name on the API server's certificate
    assert "extensions" not in cluster  # nothing of the bastion (test_the_kubeconfig_outlives_the_bastion)
    command = _tunnel(rec)
    assert command[:3] == ["aws", "ssm", "start-session"]
    assert command[command.index("--target") + 1] == placeholder("id", "gpu-serving-test-bastion")
    assert command[command.index("--document-name") + 1] == "AWS-StartPortForwardingSessionToRemoteHost"
    assert command[command.index("--parameters") + 1] == f"host={ENDPOINT_HOST},portNumber=443,localPortNumber=9443"
    # The Kubernetes layer waits for the way in, and on destroy goes before it.
    assert {"gpu-serving-test-bastion", "gpu-serving-test-api-from-bastion"} <= _provider_waits_for(rec)


def _tunnel(rec: Recording) -> list[str]:
    return shlex.split(rec.outputs["apiTunnelCommand"])


def _provider_kubeconfig(rec: Recording) -> str:
    raw = rec.one(K8S_PROVIDER).inputs["kubeconfig"]
    return unwrap_rpc_secret(raw) if is_rpc_secret(raw) else raw


@pytest.mark.parametrize("mode", access.MODES)
def test_the_kubeconfig_outlives_the_bastion(mode):
    # pulumi-kubernetes replaces a provider whose kubeconfig cluster changes, and with it every object it
    # manages. What the provider is given may name the cluster (replaced only with the whole stack), never
    # another resource: the bastion is replaced by any new version of its launch template (a tag, its AMI).
    rec = _mode(mode)
    named = set(re.findall(r"<[a-z-]+:([^>]+)>", _provider_kubeconfig(rec)))
    assert named == {"gpu-serving-test-eks"}, named
    assert json.loads(_provider_kubeconfig(rec)) == _kubeconfig(rec)  # the exported one is the provider's
    assert ("apiTunnelCommand" in rec.outputs) == (mode == access.PRIVATE_SSM)


def test_the_kubeconfig_and_the_tunnel_use_the_stacks_aws_profile():
    rec = _run({**_config({"endpointAccess": "private-ssm"}), "aws:profile": "serving-admin"})
    exec_args = _kubeconfig(rec)["users"][0]["user"]["exec"]["args"]
    assert exec_args[exec_args.index("--profile") + 1] == "serving-admin"
    command = _tunnel(rec)
    assert command[command.index("--profile") + 1] == "serving-admin"
    (aws_provider,) = [r for r in rec.resources if r.type == "pulumi:providers:aws"]
    assert aws_provider.inputs["profile"] == "serving-admin"  # an explicit provider reads no aws: config itself
    # Without it, no profile anywhere: the standard credential chain.
    assert "--profile" not in _kubeconfig(_mode(access.PRIVATE_SSM))["users"][0]["user"]["exec"]["args"]


def test_private_ssm_tunnel_port_is_the_configs():
    rec = _run(_config({"endpointAccess": "private-ssm", "apiTunnelPort": 18443}))
    cluster = _kubeconfig(rec)["clusters"][0]["cluster"]
    assert cluster["server"] == "https://localhost:18443"
    assert _tunnel(rec)[-1].endswith("localPortNumber=18443")


def test_private_vpc_admits_the_in_vpc_deployer_on_443():
    rec = _mode(access.PRIVATE_VPC)
    vpc = _vpc_config(rec)
    assert (vpc["endpointPublicAccess"], vpc["endpointPrivateAccess"]) == (False, True)
    assert rec.of_type(INSTANCE) == []
    (rule,) = _api_rules(rec)
    assert (rule["cidrIpv4"], rule["ipProtocol"], rule["fromPort"], rule["toPort"]) == ("10.20.0.0/24", "tcp", 443, 443)
    assert _provider_waits_for(rec) >= {n for n in (r.name for r in rec.of_type(INGRESS)) if "api-from" in n}
    cluster = _kubeconfig(rec)["clusters"][0]["cluster"]
    assert cluster["server"] == f"https://{ENDPOINT_HOST}"  # resolves to the private endpoint inside the VPC


def test_the_exported_kubeconfig_is_a_valid_kubeconfig_in_every_mode():
    # client-go's kubeconfig (clientcmd/api/v1): clusters[].cluster takes server, tls-server-name,
    # certificate-authority-data (and extensions, which the stack no longer writes).
    allowed = {"server", "tls-server-name", "certificate-authority-data"}
    for mode in access.MODES:
        config = _kubeconfig(_mode(mode))
        assert config["apiVersion"] == "v1" and config["kind"] == "Config"
        cluster = config["clusters"][0]["cluster"]
        assert set(cluster) <= allowed, mode
        assert cluster["certificate-authority-data"] == placeholder("ca-data", "gpu-serving-test-eks")
        assert config["users"][0]["user"]["exec"]["command"] == "aws"


def test_the_tunnel_command_is_one_the_aws_cli_takes():
    ssm = botocore.session.get_session().get_service_model("ssm")
    params = ssm.operation_model("StartSession").input_shape.members
    assert {"Target", "DocumentName", "Parameters"} <= set(params)
    cmd = access.tunnel_command("i-0123456789abcdef0", "https://ABC.gr7.us-east-1.eks.amazonaws.com", "us-east-1", 9443)
    assert cmd[cmd.index("--parameters") + 1] == "host=ABC.gr7.us-east-1.eks.amazonaws.com,portNumber=443,localPortNumber=9443"
    assert access.endpoint_host("https://ABC.gr7.us-east-1.eks.amazonaws.com/") == "ABC.gr7.us-east-1.eks.amazonaws.com"


# --- combinations that leave the deployer out are refused at preview -----------------------------


def _refused(config: dict[str, str], *fragments: str) -> str:
    partial = Recording()
    with pytest.raises(pulumi.RunError) as info:
        _run(config, into=partial)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    assert "\n" not in message, "one message"
    assert [r.type for r in partial.resources] == [STACK_TYPE]  # nothing registered
    return message


def test_private_only_without_a_way_in_is_refused_with_one_message():
    message = _refused(
        _config({"endpointAccess": "private-vpc", "deployerCidrs": ["10.20.0.0/24"]}),
        "gpu-serving:cluster.endpointAccess",
        "creates its own VPC",
        "private-ssm",
        "existingVpcId",
    )
    assert message.startswith("Pulumi.test.yaml: ")


@pytest.mark.parametrize(
    "cluster, network, fragments",
    [
        ({"endpointAccess": "public-restricted"}, None, ("gpu-serving:cluster.endpointAccess", "deployerCidrs")),
        ({"endpointAccess": "private-vpc"}, EXISTING, ("gpu-serving:cluster.endpointAccess", "443")),
        ({"endpointAccess": "private-ssm", "deployerCidrs": ["198.51.100.7/32"]}, None, ("gpu-serving:cluster.deployerCidrs",)),
        ({"publicAccessCidrs": []}, None, ("gpu-serving:cluster.publicAccessCidrs", "endpointAccess")),
    ],
)
def test_other_unusable_access_settings_are_refused(cluster, network, fragments):
    _refused(_config(cluster, network), *fragments)


def test_production_never_opens_the_endpoint_to_the_internet():
    config = dict(engine_config("prod", REPO))
    area = json.loads(config["gpu-serving:cluster"])
    area.update(endpointAccess="public-restricted", deployerCidrs=["0.0.0.0/0"])
    config["gpu-serving:cluster"] = json.dumps(area)
    partial = Recording()
    with pytest.raises(pulumi.RunError) as info:
        record(lambda: runpy.run_path(str(REPO), run_name="__main__"), stack="prod", config=config, into=partial)
    assert "gpu-serving:cluster.deployerCidrs: 0.0.0.0/0 opens the API endpoint of a production cluster" in str(info.value)


def test_the_deploying_pages_two_step_first_up_excludes_the_real_provider():
    # The first step skips the Kubernetes provider by its URN: the one the engine gives it in the prod stack.
    (provider,) = [r for r in repo_stack("prod")["resources"] if r["type"] == K8S_PROVIDER]
    readme = (REPO / "docs" / "deploying.md").read_text()
    assert f"--exclude '{provider['urn']}'" in readme.replace("\\\n  ", "")
    assert "--exclude-dependents" in readme and access.TUNNEL_DOCUMENT in readme
