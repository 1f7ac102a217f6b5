"""How the GPU instances are bought, and what that fixes about them.

- `on-demand`: EC2 On-Demand instances. EC2's default reservation preference
  ("open") still uses a matching open Capacity Reservation when there is one.
- `capacity-reservation`: an On-Demand Capacity Reservation, targeted by its id
  (`cr-...`).
- `capacity-block`: an EC2 Capacity Block for ML, also targeted by its
  reservation id (Amazon EKS User Guide, "Create a managed node group with
  Capacity Blocks for ML").

Reserved capacity (the last two) is bought for one zone and its placement is
fixed already: the nodes must name the reservation; a reservation made in a
cluster placement group (AWS recommends one for p5) launches only into that
group, which the stack then names instead of creating one; and there is no
spare instance to launch a replacement into before the old node goes.

The stack config (`gpu-serving:gpu.capacity`) takes these names, and the GPU
node group's builders translate them into launch template and node group
settings (`infra/aws/gpu_nodes.py`).
"""

from __future__ import annotations

ON_DEMAND = "on-demand"
CAPACITY_RESERVATION = "capacity-reservation"
CAPACITY_BLOCK = "capacity-block"

CAPACITY_KINDS = (ON_DEMAND, CAPACITY_RESERVATION, CAPACITY_BLOCK)
RESERVED_KINDS = (CAPACITY_RESERVATION, CAPACITY_BLOCK)


def is_reserved(kind: str) -> bool:
    """Whether `kind` launches into a reservation: it needs the reservation's id, and a
    replacement node has no spare instance to launch into."""
    return kind in RESERVED_KINDS


def creates_placement_group(kind: str) -> bool:
    """Whether the stack creates a cluster placement group for nodes of `kind` by default (on demand only).

    A reservation or Capacity Block was made for one zone, and, when it was made
    in a cluster placement group, only launches into that group (EC2 User Guide,
    "Use Capacity Reservations with cluster placement groups"): its nodes name
    that existing group (`gpu-serving:network.placementGroupName`), never a new one.
    """
    return kind == ON_DEMAND
