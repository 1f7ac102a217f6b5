"""The AWS side of `python -m infra scan`: what the Terraform-plan conversion must get right for
checkov to judge the stack, and the scan of prod and test with no AWS finding left unaccepted.

- A placeholder (`<id:NAME>`) names a resource by its name alone, so two AWS resources
  that share a name make a reference a guess: the conversion fails instead, and the
  stacks keep their AWS names distinct.
- An instance launched from a launch template carries the template's effective values
  (EC2 takes what the request leaves out from the template), which checkov's instance
  checks read on the instance.
- The real checkov (pinned, `venv-scan/`) over hand-made resources and over the prod
  and test syntheses (those scans shared with tests/test_scan.py: tests/checkov_runs.py).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from infra.preview import scan
from infra.preview.convert import terraform as tf
from tests import checkov_runs
from tests.test_scan import PROVIDER, planned, res, synth

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTANCE = "aws:ec2/instance:Instance"
TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"


# --------------------------------------------------------------------------- names and references


def test_a_placeholder_naming_two_resources_fails_the_conversion():
    doc = {"resources": [
        PROVIDER,
        res("aws:ec2/securityGroup:SecurityGroup", "bastion", {"description": "d"}),
        res("aws:iam/instanceProfile:InstanceProfile", "bastion", {"role": "r"}),
        res(TEMPLATE, "lt", {"vpcSecurityGroupIds": ["<id:bastion>"]}),
    ]}  # fmt: skip
    p = tf.plan(doc)
    (gap,) = p.gaps
    assert gap.blocking and gap.resource == "lt" and "aws_security_group.bastion" in gap.reason
    assert "aws_iam_instance_profile.bastion" in gap.reason
    _, exprs = planned(doc)
    assert "vpc_security_group_ids" not in exprs["aws_launch_template.lt"]  # no guessed reference


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_no_two_aws_resources_of_a_stack_share_a_name(stack):
    names = Counter(r["name"] for r in synth(stack)["resources"] if r["type"].startswith("aws:") and r["custom"])
    assert not [n for n, k in names.items() if k > 1]
    assert not [g for g in tf.plan(synth(stack)).gaps if g.blocking]


# --------------------------------------------------------------------------- instances from launch templates


def _bastion(instance: dict | None = None, template: dict | None = None) -> dict:
    t = {"imageId": "resolve:ssm:/aws/service/x", "instanceType": "t3.micro", "ebsOptimized": "true",
         "monitoring": {"enabled": True}, "iamInstanceProfile": {"arn": "<arn:profile>"}, "vpcSecurityGroupIds": ["<id:sg>"],
         "blockDeviceMappings": [{"deviceName": "/dev/xvda", "ebs": {"encrypted": "true", "volumeSize": 8, "deleteOnTermination": "true"}},
                                 {"deviceName": "/dev/xvdb", "ebs": {"encrypted": "true"}},
                                 {"deviceName": "/dev/sdc", "virtualName": "ephemeral0"}]}  # fmt: skip
    t.update(template or {})
    i = {"subnetId": "subnet-1", "launchTemplate": {"id": "<id:lt>", "version": "1"}}
    i.update(instance or {})
    return {"stack": "t", "resources": [
        PROVIDER,
        res("aws:ec2/securityGroup:SecurityGroup", "sg", {"description": "d"}),
        res("aws:iam/instanceProfile:InstanceProfile", "profile", {"role": "r"}),
        res(TEMPLATE, "lt", t),
        res(INSTANCE, "bastion", i),
    ]}  # fmt: skip


def test_an_instance_from_a_template_shows_the_templates_effective_values():
    values, exprs = planned(_bastion())
    v, e = values["aws_instance.bastion"], exprs["aws_instance.bastion"]
    assert (v["instance_type"], v["ebs_optimized"], v["monitoring"]) == ("t3.micro", True, True)
    assert v["root_block_device"] == [{"encrypted": True, "volume_size": 8, "delete_on_termination": True}]
    assert v["ebs_block_device"] == [{"device_name": "/dev/xvdb", "encrypted": True}]  # not the root; no instance store
    assert e["iam_instance_profile"] == {"references": ["aws_iam_instance_profile.profile.arn", "aws_iam_instance_profile.profile"]}
    assert e["vpc_security_group_ids"] == {"references": ["aws_security_group.sg.id", "aws_security_group.sg"]}
    assert "ami" not in v  # an SSM parameter is no AMI id


def test_the_request_overrides_the_template():
    values, exprs = planned(_bastion({"instanceType": "t3.small", "monitoring": False, "iamInstanceProfile": "named",
                                      "rootBlockDevice": {"encrypted": False}}))  # fmt: skip
    v, e = values["aws_instance.bastion"], exprs["aws_instance.bastion"]
    assert (v["instance_type"], v["monitoring"], v["iam_instance_profile"]) == ("t3.small", False, "named")
    assert v["root_block_device"] == [{"encrypted": False}] and "ebs_block_device" not in v
    assert "iam_instance_profile" not in e


def test_an_instance_without_a_template_in_the_plan_is_left_alone():
    doc = {"resources": [PROVIDER, res(INSTANCE, "vm", {"launchTemplate": {"id": "lt-0123", "version": "1"}})]}
    values, _ = planned(doc)
    assert set(values["aws_instance.vm"]) == {"launch_template", "tags", "tags_all"}


# --------------------------------------------------------------------------- checkov


INSTANCE_CHECKS = {"CKV_AWS_8", "CKV_AWS_126", "CKV_AWS_135", "CKV2_AWS_41"}


def _failed(result: scan.ScanResult, resource: str) -> set[str]:
    return {f.check for f in result.not_accepted if f.resource == resource}


def test_checkov_judges_an_instance_by_its_templates_settings(checkov):
    good = scan.scan_document(_bastion(), [], checkov)
    assert not _failed(good, "aws_instance.bastion") & INSTANCE_CHECKS, _failed(good, "aws_instance.bastion")
    assert "CKV2_AWS_5" not in _failed(good, "aws_security_group.sg")
    bare = {"blockDeviceMappings": [], "monitoring": {"enabled": False}, "ebsOptimized": "false", "iamInstanceProfile": {}}
    bad = scan.scan_document(_bastion(template=bare), [], checkov)
    assert INSTANCE_CHECKS <= _failed(bad, "aws_instance.bastion")


@pytest.mark.parametrize("stack", ["prod", "test"])
def test_no_aws_finding_of_the_stacks_is_left_unaccepted(checkov, stack):
    result = scan.scan_document(synth(stack), scan.load_accepted(REPO_ROOT / scan.ACCEPTED_RISKS), checkov, runner=checkov_runs.runner)
    assert not result.errors
    assert [(f.check, f.resource) for f in result.not_accepted if f.framework == "terraform_plan"] == []
    accepted = sorted((f.check, f.resource) for f, _ in result.accepted if f.framework == "terraform_plan")
    # The serving access point is rooted at / (accepted); the staging one at the checkpoint's directory, enforcing the
    # staging user, passes both EFS access point checks (CKV_AWS_329, CKV_AWS_330).
    weights = f"aws_efs_access_point.gpu-serving-{stack}-weights-efs-ap"
    assert accepted == [("CKV_AWS_135", f"aws_instance.gpu-serving-{stack}-bastion"),  # t3 is EBS-optimized by default
                        ("CKV_AWS_329", f"{weights}-serving")]  # fmt: skip
    assert not [r for r in result.stale if r.resource.startswith("aws_")]
    assert result.counts["terraform_plan"].failed == len(accepted) and result.counts["terraform_plan"].passed > 150


def test_the_bastion_type_is_ebs_optimized_by_default():
    """CKV_AWS_135 is accepted because EC2 runs the bastion's type EBS-optimized whatever the request says (moto's
    DescribeInstanceTypes data); a type without that default would need the flag, and a new bastion."""
    from moto.utilities.utils import load_resource

    from infra.aws.access import BASTION_INSTANCE_TYPE

    types = load_resource("ec2/resources/instance_types.json")
    assert types[BASTION_INSTANCE_TYPE]["EbsInfo"]["EbsOptimizedSupport"] == "default"
    assert types["t2.micro"]["EbsInfo"]["EbsOptimizedSupport"] == "unsupported"  # the data tells types apart
