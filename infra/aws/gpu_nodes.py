"""What a GPU node's launch template and EKS node group say, as plain data.

Pure functions (no Pulumi, no AWS calls): `components/gpu_nodes.py` turns their
results into resource arguments, and the tests check them against moto's copy of
EC2 DescribeInstanceTypes and botocore's service models.

EFA interface layout
--------------------
We follow the layout AWS currently recommends, on purpose:

    card 0 / device 0       "interface"  the primary ENI: node IP and the pods' IPs (VPC CNI)
    card 0 / device 1       "efa-only"   card 0's EFA device
    card i / device 0       "efa-only"   one EFA device on every other card, i = 1 .. N-1

On p6-b300.48xlarge card 0 takes no EFA (EC2 lists only `interface` for it), so
its 16 EFA devices go on cards 1 .. 16 and card 0 holds the primary ENI alone
(`InstanceType.first_efa_card`).

Sources: Amazon EKS User Guide, "Manage EFA devices on Amazon EKS", section "EKS
managed node groups and self-managed nodes" (launch template example for
p6-b200.48xlarge: 1 ENA interface + 8 EFA-only interfaces), and the Amazon EC2
User Guide, "Maximize network bandwidth on Amazon EC2 instances with multiple
network cards" (primary: ENA `interface`; card 0 / device 1 `efa-only` when card
0 supports EFA; every further card: device 0 `efa-only`).

Why this one and not the alternatives:
- every EFA device the instance has is used (N EFA devices on N cards), so NCCL
  sees the full 3200 Gbps fabric on p5 (32 x 100 Gbps);
- only the primary ENI carries IP addresses: 32 `efa` interfaces would each take
  IPs from the GPU subnet (and the VPC CNI would warm more on each), which can
  exhaust it; `efa-only` interfaces take none;
- the primary interface is a plain ENA interface, not `efa`, exactly as AWS's
  example; the older "card 0 `efa`, cards 1..N-1 device 1 `efa-only`" layout
  (terraform-aws-eks, pulumi-eks) also works but leaves card 0 with an EFA
  device that shares the node's IP interface.

Cost of the choice: the template declares N + 1 interfaces (33 on p5.48xlarge),
N of them EFA, and the cluster's VPC CNI must know `efa-only` interfaces (it
must not try to give them IPs): VPC CNI >= 1.18.4, as recorded in
the EKS User Guide, "Manage EFA devices on Amazon EKS" (the cluster component pins the add-on version).

Per EC2 (moto 5.2.5's instance_types data) every GPU type in the catalog has
exactly one EFA per network card (p4d/p4de 4/4, p5/p5e 32/32, p5en 16/16,
p6-b200 8/8, g6e.48xlarge 4/4, g5/g6e single-card types 1/1), and the layout
puts at most 2 interfaces on card 0 and 1 on each other card, within every
card's MaximumNetworkInterfaces (2 on p5/p5e, the tightest). Should a type ever
report more EFA interfaces than cards, the extra ones are dealt out round-robin
over the cards on the next free device index, so every EFA still has its own
card/device slot.
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import yaml

from infra.catalog.capacity import CAPACITY_BLOCK, CAPACITY_KINDS, CAPACITY_RESERVATION, ON_DEMAND, is_reserved
from infra.catalog.eks import AL2023, BOTTLEROCKET, ami_family
from infra.catalog.instances import InstanceType

# EC2 launch template values (checked against botocore's ec2 model by the tests).
INTERFACE = "interface"  # ENA only: carries IP addresses
EFA = "efa"  # EFA with ENA: not in this layout, but counted as an EFA device if a template has one
EFA_ONLY = "efa-only"  # EFA device only: no IP addresses
MARKET_CAPACITY_BLOCK = "capacity-block"  # EC2 MarketType

# EKS node group capacity types (checked against botocore's eks model by the tests).
NODE_GROUP_ON_DEMAND = "ON_DEMAND"
NODE_GROUP_CAPACITY_BLOCK = "CAPACITY_BLOCK"


def efa_interfaces(itype: InstanceType, security_group_ids: Sequence[Any]) -> list[dict]:
    """The launch template's network interfaces for `itype` (layout: see the module doc).

    `security_group_ids` go on every interface: a launch template that declares
    network interfaces cannot carry security groups itself, and EKS adds the
    cluster security group only when the template names none, so the caller
    passes the cluster SG along with the EFA SG. Items may be Pulumi outputs;
    they are passed through untouched.
    """
    groups = list(security_group_ids)
    if not groups:
        raise ValueError(
            "efa_interfaces needs the security groups (EFA SG and cluster SG): with interfaces declared, "
            "EKS adds no cluster security group and the node could not join"
        )
    cards = itype.network_cards
    efa_count = itype.max_efa_interfaces
    if cards < 1 or efa_count < 0:
        raise ValueError(f"{itype.name}: network_cards={cards}, max_efa_interfaces={efa_count}")

    def nic(card: int, device: int, kind: str) -> dict:
        return {
            "network_card_index": card,
            "device_index": device,
            "interface_type": kind,
            "security_groups": list(groups),
            "delete_on_termination": True,
        }

    # The primary ENI first; then the EFA devices, dealt out one per card over the cards
    # that take EFA (card 0 on most types; p6-b300's card 0 is ENA-only: itype.first_efa_card).
    result = [nic(0, 0, INTERFACE)]
    next_device = [1] + [0] * (cards - 1)  # card 0's device 0 is the primary ENI
    first = itype.first_efa_card
    for k in range(efa_count):
        card = first + k % (cards - first)
        result.append(nic(card, next_device[card], EFA_ONLY))
        next_device[card] += 1
    return result


def efa_interface_count(interfaces: Sequence[dict]) -> int:
    """How many of `interfaces` are EFA devices (`efa` or `efa-only`)."""
    return sum(1 for i in interfaces if i["interface_type"] in (EFA, EFA_ONLY))


@dataclass(frozen=True)
class CapacitySettings:
    """Where a GPU node group's instances come from, as the template and node group say it."""

    node_group_capacity_type: str  # EKS CapacityTypes: ON_DEMAND | CAPACITY_BLOCK
    # Launch template blocks (pulumi_aws argument names), None when not set.
    instance_market_options: dict | None
    capacity_reservation_specification: dict | None


def capacity_settings(kind: str, reservation_id: str | None) -> CapacitySettings:
    """Capacity settings for `kind` (one of `infra.catalog.capacity.CAPACITY_KINDS`).

    - on-demand: node group ON_DEMAND, no market options, no reservation target
      (EC2's default "open" preference still uses a matching open reservation).
    - capacity-reservation: ON_DEMAND, and the template targets the reservation.
    - capacity-block (EKS User Guide, "Create a managed node group with Capacity
      Blocks for ML"): template market type "capacity-block" plus the reservation
      target, node group capacity type CAPACITY_BLOCK.

    `reservation_id` is required for the reserved kinds and refused on demand
    (a ValueError: the stack config checks this for the user first).
    """
    if kind not in CAPACITY_KINDS:
        raise ValueError(f"capacity_settings: unknown kind {kind!r}; known: {', '.join(CAPACITY_KINDS)}")
    if not is_reserved(kind):
        if reservation_id:
            raise ValueError(f"capacity_settings: reservation_id {reservation_id!r} given with kind {kind!r}")
        return CapacitySettings(NODE_GROUP_ON_DEMAND, None, None)
    if not reservation_id:
        raise ValueError(f"capacity_settings: kind {kind!r} needs a reservation_id (cr-...)")
    target = {"capacity_reservation_target": {"capacity_reservation_id": reservation_id}}
    if kind == CAPACITY_RESERVATION:
        return CapacitySettings(NODE_GROUP_ON_DEMAND, None, target)
    assert kind == CAPACITY_BLOCK
    return CapacitySettings(NODE_GROUP_CAPACITY_BLOCK, {"market_type": MARKET_CAPACITY_BLOCK}, target)


def update_config(node_count: int, capacity_kind: str = ON_DEMAND) -> dict:
    """The node group's update policy: never more than one GPU node unavailable at once.

    The strategy says where the replacement comes from. DEFAULT (on demand) launches
    the new node before it terminates the old one, so serving capacity never drops
    below node_count - 1 and an update that cannot get a spare p5 fails instead of
    taking capacity away. MINIMAL (reservation, Capacity Block) terminates first:
    a reservation sized to the plan has no spare instance to surge into, and the
    EKS API documents MINIMAL for exactly this case (resource-constrained GPUs).
    """
    if node_count < 1:
        raise ValueError(f"update_config: node_count must be at least 1, got {node_count}")
    strategy = "MINIMAL" if is_reserved(capacity_kind) else "DEFAULT"
    return {"max_unavailable": 1, "update_strategy": strategy}


def root_device_name(ami_type: str) -> str:
    """The block device that holds container images and caches for an EKS AMI type.

    AL2023: the root volume, /dev/xvda. Bottlerocket: the data volume, /dev/xvdb
    (its /dev/xvda is the small OS volume; images live on the data volume).
    """
    return "/dev/xvdb" if ami_family(ami_type) == BOTTLEROCKET else "/dev/xvda"


# --------------------------------------------------------------------------- node disks

# nodeadm's NodeConfig (awslabs/amazon-eks-ami, nodeadm/doc/api.md): `spec.instance.localStorage.strategy`
# is one of RAID0, RAID10, Mount; RAID0 puts every instance-store NVMe device of the instance into one
# array mounted at /mnt/k8s-disks and bind-mounts containerd's and the kubelet's directories onto it.
NODEADM_API_VERSION = "node.eks.aws/v1alpha1"
NODEADM_CONTENT_TYPE = "application/node.eks.aws"
LOCAL_STORAGE_STRATEGIES = ("RAID0", "RAID10", "Mount")
LOCAL_STORAGE_STRATEGY = "RAID0"
USER_DATA_BOUNDARY = "GPU-SERVING-NODEADM"


def uses_instance_store(ami_type: str, itype: InstanceType) -> bool:
    """Whether containerd and the kubelet go on the instance store (AL2023 nodeadm; the type has local NVMe)."""
    return ami_family(ami_type) == AL2023 and itype.local_nvme_bytes > 0


# Containers' locked-memory limit on EFA nodes. libfabric's EFA provider pins host memory, and the kernel
# refuses a pin beyond RLIMIT_MEMLOCK to a process without CAP_IPC_LOCK (`ib_umem_get`); Kubernetes has no
# ulimit field, so the limit comes from containerd's base runtime spec, which nodeadm writes from its default
# merged with `spec.containerd.baseRuntimeSpec` (awslabs/amazon-eks-ami, nodeadm/internal/containerd/
# base_runtime_spec.go; the field: PR #1794). The merge (nodeadm/internal/util/merge.go, mergo WithOverride)
# replaces arrays whole, so `process.rlimits` must repeat the default's open-file limit
# (nodeadm/internal/containerd/base-runtime-spec.json: RLIMIT_NOFILE 65536 soft, 1048576 hard; its e2e case
# containerd-base-runtime-spec shows a given list replacing it). It also decodes numbers into float64, so
# "unlimited" (2**64 - 1) would come out as 2**64 and no longer parse as the uint64 the OCI spec wants:
# 2**63 bytes is exact in a float64 and beyond any instance's memory, which is what bounds pinning.
# Bottlerocket raises it to unlimited by itself when an EFA device is attached (bottlerocket-core-kit,
# sources/api/schnauzer/src/helpers/mod.rs, generate_oci_resource_limits).
DEFAULT_NOFILE_RLIMIT = {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
EFA_MEMLOCK_BYTES = 2**63


def raises_memlock(ami_type: str, itype: InstanceType) -> bool:
    """Whether the node's user data raises the containers' locked-memory limit (AL2023, an EFA type)."""
    return ami_family(ami_type) == AL2023 and itype.max_efa_interfaces > 0


def node_config(ami_type: str, itype: InstanceType) -> Optional[dict]:
    """The nodeadm NodeConfig of the GPU nodes' user data, or None when it would be empty.

    - `spec.instance.localStorage.strategy: RAID0` on a type with instance store, so
      images, image layers, caches and emptyDir volumes are on the local NVMe rather
      than the EBS root volume;
    - `spec.containerd.baseRuntimeSpec.process.rlimits` on an EFA type: the open-file
      default and RLIMIT_MEMLOCK at EFA_MEMLOCK_BYTES, so the serving containers register
      EFA memory without root or CAP_IPC_LOCK (infra/k8s/pod_security.py).
    The type alone decides (not the node count), so scaling never changes the template.
    """
    spec: dict = {}
    if uses_instance_store(ami_type, itype):
        spec["instance"] = {"localStorage": {"strategy": LOCAL_STORAGE_STRATEGY}}
    if raises_memlock(ami_type, itype):
        memlock = {"type": "RLIMIT_MEMLOCK", "soft": EFA_MEMLOCK_BYTES, "hard": EFA_MEMLOCK_BYTES}
        spec["containerd"] = {"baseRuntimeSpec": {"process": {"rlimits": [dict(DEFAULT_NOFILE_RLIMIT), memlock]}}}
    if not spec:
        return None
    return {"apiVersion": NODEADM_API_VERSION, "kind": "NodeConfig", "spec": spec}


def node_user_data(ami_type: str, itype: InstanceType) -> Optional[str]:
    """The launch template's user data: a MIME multi-part document with one nodeadm NodeConfig, or None.

    EKS merges it with the NodeConfig that joins the node to the cluster (EKS
    User Guide, "Customize managed nodes with launch templates": user data of
    managed node groups on Amazon Linux must be a MIME multi-part archive, and
    EKS merges its own with it when the template names no AMI). What it asks
    for: `node_config`. None where nothing applies (Bottlerocket, or a type
    with neither instance store nor EFA).
    """
    config = node_config(ami_type, itype)
    if config is None:
        return None
    b = USER_DATA_BOUNDARY
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{b}"\n'
        "\n"
        f"--{b}\n"
        f"Content-Type: {NODEADM_CONTENT_TYPE}\n"
        "\n"
        "---\n"
        + yaml.safe_dump(config, sort_keys=False)
        + "\n"
        f"--{b}--\n"
    )


def encode_user_data(text: Optional[str]) -> Optional[str]:
    """Launch template user data is base64 (EC2 RequestLaunchTemplateData.UserData)."""
    return None if text is None else base64.b64encode(text.encode()).decode()


# gp3 (EBS User Guide, "General Purpose SSD volumes"): 3,000 IOPS and 125 MiB/s included at any size; at most
# 500 IOPS per GiB and 0.25 MiB/s per provisioned IOPS. The ranges: EC2 CreateVolume in botocore's ec2 model
# (`Iops` "gp3: 3,000 (default) - 80,000 IOPS", `Throughput` "125 - 2000 MiB/s"; the tests read them).
GP3_BASE_IOPS, GP3_BASE_MIBPS = 3_000, 125
GP3_MAX_IOPS, GP3_MAX_MIBPS = 80_000, 2_000
GP3_IOPS_PER_GIB = 500
GP3_MIBPS_PER_IOPS = 0.25

# What the root volume has to write when it holds containerd (no instance store): the serving image. ASSUMPTION,
# the figures infra/planning/serving.py sizes the root volume with: ~20 GiB compressed, ~40 GiB unpacked, both
# written while the image is pulled. ASSUMPTION: that should take no more than 4 minutes of a node's cold
# start (the weights load from the shared file system in parallel), and unpacking writes blocks of ~64 KiB.
IMAGE_PULL_WRITE_GIB = 20 + 40
IMAGE_PULL_SECONDS = 240
IMAGE_UNPACK_IO_KIB = 64


@dataclass(frozen=True)
class VolumePerformance:
    iops: int
    throughput_mibps: int
    why: str


def root_volume_performance(size_gib: int, on_instance_store: bool) -> VolumePerformance:
    """IOPS and throughput of the gp3 root volume, from what it has to hold.

    With containerd and the kubelet on the instance store (`node_user_data`),
    the root volume holds the OS and logs: gp3's included 3,000 IOPS and
    125 MiB/s. Otherwise it takes the image pull: IMAGE_PULL_WRITE_GIB within
    IMAGE_PULL_SECONDS, rounded up to 25 MiB/s, and the IOPS those writes need
    at IMAGE_UNPACK_IO_KIB per write, never below the included figures and
    within gp3's limits for the volume's size.
    """
    if size_gib < 1:
        raise ValueError(f"root volume of {size_gib} GiB")
    if on_instance_store:
        return VolumePerformance(GP3_BASE_IOPS, GP3_BASE_MIBPS, "images and caches on the instance store (RAID0): gp3 baseline")
    mibps = math.ceil(IMAGE_PULL_WRITE_GIB * 1024 / IMAGE_PULL_SECONDS / 25) * 25
    iops = math.ceil(mibps * 1024 / IMAGE_UNPACK_IO_KIB / 100) * 100
    iops = max(GP3_BASE_IOPS, min(iops, GP3_MAX_IOPS, GP3_IOPS_PER_GIB * size_gib))
    mibps = max(GP3_BASE_MIBPS, min(mibps, GP3_MAX_MIBPS, int(iops * GP3_MIBPS_PER_IOPS)))
    return VolumePerformance(iops, mibps, f"the {IMAGE_PULL_WRITE_GIB} GiB image pull within {IMAGE_PULL_SECONDS} s")


# --------------------------------------------------------------------------- Capacity Block lifecycle


def capacity_block_key(reservation_id: str) -> str:
    """A short, stable key of a reservation id, for the names of what belongs to one Capacity Block."""
    return hashlib.sha256(reservation_id.encode()).hexdigest()[:8]


def resource_names(name: str, capacity_kind: str, reservation_id: Optional[str]) -> tuple[str, str]:
    """(launch template, node group) resource names of a GPU node group.

    A Capacity Block gets a node group (and template) of its own, named after
    the block: a new block is a new reservation id, so a new node group is
    created next to the old one, and the old one is deleted once the new one is
    up (Pulumi deletes what the program no longer declares at the end of the
    update). The new group never inherits the old one's nodes, and EKS never
    updates a Capacity Block group in place. Other kinds keep fixed names.
    """
    if capacity_kind == CAPACITY_BLOCK:
        if not reservation_id:
            raise ValueError("a Capacity Block node group needs its reservation id")
        key = capacity_block_key(reservation_id)
        return f"{name}-lt-{key}", f"{name}-ng-{key}"
    return f"{name}-lt", f"{name}-ng"


# Node group inputs whose change rolls the nodes through UpdateNodegroupVersion (terraform-provider-aws,
# internal/service/eks/node_group.go); the Pulumi property paths.
ROLLING_FIELDS = ("launchTemplate.version", "releaseVersion", "version")


def replacement_options(capacity_kind: str) -> dict[str, Any]:
    """Resource options (pulumi names) of the GPU node group that decide how its nodes are changed.

    Capacity Block: EKS requires a managed node group that uses a Capacity
    Block to be at desired size 0 when it is updated (EKS User Guide, "Create a
    managed node group with Capacity Blocks for ML", considerations). So a
    change that would update its nodes (a new template version, AMI release or
    Kubernetes version) replaces the group instead, deleting the old one first:
    its instances go back into the block before the new group launches into it.
    Other kinds: updated in place, one node at a time (`update_config`).
    """
    if capacity_kind == CAPACITY_BLOCK:
        return {"replace_on_changes": list(ROLLING_FIELDS), "delete_before_replace": True}
    return {"replace_on_changes": [], "delete_before_replace": False}


def repair_config() -> dict[str, Any]:
    """Node auto repair (EKS User Guide, "Enable node auto repair and investigate node health issues"):
    on, one GPU node at a time, like the update policy."""
    return {"enabled": True, "max_parallel_nodes_repaired_count": 1}
