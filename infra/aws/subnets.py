"""Subnet arithmetic for the stack's VPC: pure functions, no Pulumi, no AWS.

`subnet_layout(cidr, azs, gpu_az)` carves a VPC CIDR into one public and one
private subnet per availability zone plus one dedicated GPU subnet in the GPU
zone. The VPC CNI gives every pod an address from its node's subnet, and EFA
traffic does not cross subnets, so the GPU subnet is the largest by far:

    half of the VPC          the GPU subnet (in gpu_az)
    a quarter of the VPC     the private subnets, split evenly over the zones
    an eighth of the VPC     the public subnets (NAT gateways, load balancers)
    the last eighth          left free for later (e.g. a second GPU subnet)

For a /16 and three zones that is a /17 GPU subnet (32,768 addresses), /20
private subnets (4,096) and /21 public subnets (2,048). Blocks are handed out
largest first from the start of the VPC, so each is aligned to its own size and
no two overlap.
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass

from infra.errors import UserError

# AWS limits (VPC user guide, "VPC CIDR blocks" and "Subnet sizing"): a VPC's
# IPv4 block and a subnet's are each between /16 and /28.
MIN_PREFIX = 16
MAX_PREFIX = 28
MIN_ZONES = 2  # EKS requires subnets in at least two availability zones

_AZ_NAME = re.compile(r"^(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)[a-z]$")


@dataclass(frozen=True)
class SubnetLayout:
    """Subnet CIDRs by availability zone (in the order the zones were given)."""

    vpc: str
    public: dict[str, str]
    private: dict[str, str]
    gpu: str
    gpu_az: str

    def all_cidrs(self) -> list[str]:
        return [*self.public.values(), *self.private.values(), self.gpu]


def parse_vpc_cidr(cidr: str) -> ipaddress.IPv4Network:
    """The VPC block as an IPv4 network, or a UserError saying what is wrong."""
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise UserError(f"VPC CIDR {cidr!r} is not a valid network address ({exc}); write it like 10.0.0.0/16") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise UserError(f"VPC CIDR {cidr!r} is IPv6; the VPC needs an IPv4 block such as 10.0.0.0/16")
    if net.prefixlen < MIN_PREFIX or net.prefixlen > MAX_PREFIX:
        raise UserError(f"VPC CIDR {cidr!r}: AWS allows VPC blocks from /{MIN_PREFIX} to /{MAX_PREFIX}")
    return net


def check_zones(azs: list[str] | tuple[str, ...], gpu_az: str) -> None:
    """At least two distinct zones, and the GPU zone among them."""
    zones = list(azs)
    if len(zones) < MIN_ZONES:
        raise UserError(
            f"availability zones {zones}: EKS needs subnets in at least {MIN_ZONES} availability zones; list two or more"
        )
    duplicates = sorted({z for z in zones if zones.count(z) > 1})
    if duplicates:
        raise UserError(f"availability zones {zones}: {', '.join(duplicates)} listed more than once")
    if gpu_az not in zones:
        raise UserError(
            f"GPU availability zone {gpu_az!r} is not one of the availability zones {zones}; "
            "all GPU nodes and their EFA traffic must be in one of the cluster's zones"
        )


def region_of_zones(azs: list[str] | tuple[str, ...]) -> str:
    """The region all the zones belong to ("us-east-1a" -> "us-east-1")."""
    regions = set()
    for az in azs:
        match = _AZ_NAME.match(az)
        if not match:
            raise UserError(f"{az!r} is not an availability zone name such as us-east-1a")
        regions.add(match.group("region"))
    if len(regions) != 1:
        raise UserError(f"availability zones {list(azs)} span several regions {sorted(regions)}; a VPC lives in one region")
    return regions.pop()


def subnet_layout(cidr: str, azs: list[str] | tuple[str, ...], gpu_az: str) -> SubnetLayout:
    """Public, private and GPU subnet CIDRs for a VPC block (see the module docstring)."""
    vpc = parse_vpc_cidr(cidr)
    check_zones(azs, gpu_az)
    zones = list(azs)
    # Each per-zone group gets a power-of-two number of equal slots (3 zones -> 4 slots).
    slot_bits = math.ceil(math.log2(len(zones)))
    gpu_prefix = vpc.prefixlen + 1
    private_prefix = vpc.prefixlen + 2 + slot_bits
    public_prefix = vpc.prefixlen + 3 + slot_bits
    if public_prefix > MAX_PREFIX:
        raise UserError(
            f"VPC CIDR {cidr} is too small for {len(zones)} availability zones: the public subnets would be "
            f"/{public_prefix}, smaller than the /{MAX_PREFIX} AWS allows; use a /{MAX_PREFIX - 3 - slot_bits} "
            "or larger block (a /16 leaves room for many GPU pods)"
        )

    start = int(vpc.network_address)

    def block(offset: int, prefix: int) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network((start + offset, prefix))

    gpu = block(0, gpu_prefix)
    offset = gpu.num_addresses
    private: dict[str, str] = {}
    for az in zones:
        net = block(offset, private_prefix)
        private[az] = str(net)
        offset += net.num_addresses
    offset = gpu.num_addresses + (vpc.num_addresses >> 2)  # the private quarter, whole
    public: dict[str, str] = {}
    for az in zones:
        net = block(offset, public_prefix)
        public[az] = str(net)
        offset += net.num_addresses
    return SubnetLayout(vpc=str(vpc), public=public, private=private, gpu=str(gpu), gpu_az=gpu_az)
