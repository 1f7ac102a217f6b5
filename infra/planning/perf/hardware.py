"""Hardware figures the performance model works with, each with its source.

Peaks come from the GPU catalog (infra/catalog/gpus.py: datasheet HBM bandwidth and
dense tensor-core TFLOPS per dtype, NVLink per GPU). What a kernel achieves of a
peak is not here: that is `infra.planning.perf.fitted`, fitted on measurements.
This module adds the links the catalog does not describe: NVLink per direction,
PCIe for cards without NVLink, the network between nodes (EFA) and the latencies
of a message on each.
"""

from __future__ import annotations

from dataclasses import dataclass

from infra.catalog.gpus import GPU, get_gpu
from infra.catalog.instances import INSTANCE_TYPES, InstanceType, get_instance_type
from infra.errors import UserError

GB = 10**9

# PCIe per direction for cards without NVLink (TP all-reduce runs over PCIe and host
# bridges): Gen4 x16 32 GB/s (A10G, L4, L40S), Gen5 x16 64 GB/s (RTX PRO 6000 Server).
# NVIDIA product briefs of each card (PCI Express Gen 4 x16 / Gen 5 x16); the PCI-SIG
# line rates 16 GT/s and 32 GT/s per lane give 31.5 and 63 GB/s per direction.
PCIE_BYTES_PER_S = {"8.6": 32 * GB, "8.9": 32 * GB, "12.0": 64 * GB}

# ASSUMPTION: one-way latency of a small NVLink / PCIe transfer between GPUs of a node,
# ~2 us (NVIDIA's NVLink p2p latency in nvbandwidth / p2pBandwidthLatencyTest prints
# 1.9-2.5 us on H100 SXM); the all-reduce's own latency is the fitted figure.
INTRA_NODE_LATENCY_S = 2e-6
# The latency aws-ofi-nccl tells NCCL's tuner for a message between nodes over EFA:
# "NET/OFI Internode latency set at 75.0 us" (tests/fixtures/nccl/efa-aws-ofi-nccl-1.16.2.log,
# aws-ofi-nccl 1.16.2 on p4d). ASSUMPTION: the same on p5/p5e/p5en.
EFA_LATENCY_S = 75e-6
# ASSUMPTION for `--gpu NAME` without an instance type: the replica's GPUs sit on one
# 8-GPU baseboard (HGX) when the GPU has NVLink, and nodes talk at 400 Gb/s per GPU
# (p5's 3,200 Gbps per 8 GPUs).
DEFAULT_NODE_GPUS = 8
DEFAULT_NETWORK_BYTES_PER_S_PER_GPU = 400e9 / 8


@dataclass(frozen=True)
class Hardware:
    """One GPU type in nodes of `gpus_per_node`, and the links between them."""

    gpu: GPU
    gpus_per_node: int
    intra_node_bytes_per_s: float  # per GPU, per direction: NVLink, or PCIe without it
    intra_node_latency_s: float
    network_bytes_per_s: float  # per GPU, per direction, between nodes (0: none)
    network_latency_s: float
    instance: str | None  # the EC2 instance type these figures are from, if any
    source: str
    # Per GPU, per direction, between nodes without EFA: NCCL's socket transport over the
    # instance's ENA bandwidth (0 with EFA, or without an instance type).
    socket_bytes_per_s: float = 0.0

    def peak_flops(self, compute: str) -> float:
        """Dense tensor-core FLOP/s for a GEMM computing in `compute` ("bf16", "fp8", "fp4")."""
        g = self.gpu
        tflops = {"bf16": g.bf16_dense_tflops, "fp8": g.fp8_dense_tflops, "fp4": g.fp4_dense_tflops}.get(compute)
        if tflops is None:
            raise ValueError(f"{g.name} has no {compute} tensor cores")
        return tflops * 1e12


def _intra_node(gpu: GPU) -> tuple[float, str]:
    if gpu.nvlink_bandwidth_bytes_per_s:
        # The catalog's NVLink figure is both directions together (900 GB/s on H100 = 450 each way).
        return gpu.nvlink_bandwidth_bytes_per_s / 2, "NVLink per direction (half the catalog's bidirectional figure)"
    pcie = PCIE_BYTES_PER_S.get(gpu.compute_capability)
    if pcie is None:
        raise UserError(f"{gpu.name}: no NVLink and no PCIe figure in infra/planning/perf/hardware.py")
    return pcie, "PCIe per direction (no NVLink)"


def for_instance(itype: InstanceType) -> Hardware:
    """An EC2 instance type: its GPUs, and its network (EFA when it has it) split over them."""
    intra, how = _intra_node(itype.gpu)
    network = itype.network_bandwidth_gbps * 1e9 / 8 / itype.gpu_count
    return Hardware(
        gpu=itype.gpu,
        gpus_per_node=itype.gpu_count,
        intra_node_bytes_per_s=intra,
        intra_node_latency_s=INTRA_NODE_LATENCY_S,
        network_bytes_per_s=network if itype.max_efa_interfaces else 0.0,
        network_latency_s=EFA_LATENCY_S,
        socket_bytes_per_s=0.0 if itype.max_efa_interfaces else network,
        instance=itype.name,
        source=(
            f"{itype.name}: {itype.gpu_count} x {itype.gpu.name}; {how}; network {itype.network_bandwidth_gbps:,} Gbps "
            f"per node over {itype.gpu_count} GPUs ({itype.source}); {itype.gpu.source}"
        ),
    )


def for_gpu(name: str) -> Hardware:
    """A catalog GPU without an instance type: the largest catalog instance of it when
    there is one (its node size and network), else 8-GPU nodes at 400 Gb/s per GPU."""
    gpu = get_gpu(name)
    hosts = [t for t in INSTANCE_TYPES.values() if t.gpu.name == gpu.name]
    if hosts:
        return for_instance(max(hosts, key=lambda t: (t.gpu_count, t.network_bandwidth_gbps)))
    intra, how = _intra_node(gpu)
    return Hardware(
        gpu=gpu, gpus_per_node=DEFAULT_NODE_GPUS, intra_node_bytes_per_s=intra,
        intra_node_latency_s=INTRA_NODE_LATENCY_S, network_bytes_per_s=DEFAULT_NETWORK_BYTES_PER_S_PER_GPU,
        network_latency_s=EFA_LATENCY_S, instance=None,
        source=f"{gpu.name}; {how}; ASSUMPTION: 8-GPU nodes, 400 Gb/s per GPU between nodes; {gpu.source}",
    )  # fmt: skip


def hardware(*, gpu: str | None = None, instance_type: str | None = None) -> Hardware:
    if (gpu is None) == (instance_type is None):
        raise UserError("give one of --gpu NAME or --instance-type TYPE")
    return for_instance(get_instance_type(instance_type)) if instance_type else for_gpu(gpu)
