"""The EFA check's NCCL all-reduce and its verdict (efa_check.sh runs both).

    torchrun ... efa_allreduce.py run
        on every GPU: all-reduces of SIZE_BYTES over NCCL (torch.distributed);
        local rank 0 prints BUSBW_MARKER and the bus bandwidth in GB/s
    python3 efa_allreduce.py verdict LOG --floor-gbps F --efa-interfaces N
        exits 1 with the reasons when the run's log shows no EFA, a fallback
        to sockets, or a bus bandwidth below F (`efa_check_problems`)

Standard library only at import (torch is imported by `run`), so the verdict
is tested where torch is absent.
"""

import argparse
import os
import re
import sys
import time

GiB = 2**30
# nccl-tests reaches peak bus bandwidth with messages of a few GiB; 2 GiB, 5
# warm-up and 20 timed all-reduces take seconds on EFA and minutes on TCP.
SIZE_BYTES = 2 * GiB
WARMUP = 5
ITERS = 20
BUSBW_MARKER = "GPU_SERVING_BUSBW_GBPS="


def allreduce_bus_bandwidth_gbps(size_bytes, seconds, world_size):
    """nccl-tests' bus bandwidth of one all-reduce, GB/s: algbw x 2(n-1)/n (nccl-tests doc/PERFORMANCE.md)."""
    if seconds <= 0 or world_size < 1:
        raise ValueError("seconds must be positive and world_size at least 1")
    return size_bytes / seconds / 1e9 * (2 * (world_size - 1) / world_size)


def efa_check_problems(log_text, floor_gbps, efa_interfaces):
    """Why an EFA check run failed (empty: it passed), from its log.

    The log must show aws-ofi-nccl selecting the EFA provider (NCCL_DEBUG=INFO,
    subsystem NET: `NET/OFI Selected Provider is efa (found N nics)`), no
    fallback to NCCL's Socket transport, and the all-reduce's bus bandwidth
    (the BUSBW_MARKER line) at or above the floor.
    """
    problems = []
    if efa_interfaces > 0 and not re.search(r"NET/OFI Selected Provider is efa", log_text, re.IGNORECASE):
        problems.append(
            "NCCL did not select the EFA provider (no 'NET/OFI Selected Provider is efa' in the log): "
            "the image lacks libfabric/aws-ofi-nccl, or the pod got no EFA devices"
        )
    if re.search(r"Using network Socket", log_text):
        problems.append("NCCL fell back to its Socket transport (TCP), not EFA")
    found = re.findall(re.escape(BUSBW_MARKER) + r"([0-9.]+)", log_text)
    if not found:
        problems.append("no bus bandwidth in the log: the all-reduce did not complete")
    else:
        busbw = min(float(x) for x in found)
        if busbw < floor_gbps:
            problems.append(f"all-reduce bus bandwidth {busbw:.1f} GB/s is below the floor of {floor_gbps:g} GB/s")
    return problems


def run():
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    world = dist.get_world_size()
    x = torch.zeros(SIZE_BYTES // 4, dtype=torch.float32, device="cuda")
    for _ in range(WARMUP):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(ITERS):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    per_op = torch.tensor([(time.perf_counter() - start) / ITERS], dtype=torch.float64, device="cuda")
    dist.all_reduce(per_op, op=dist.ReduceOp.MAX)  # the slowest rank decides
    busbw = allreduce_bus_bandwidth_gbps(SIZE_BYTES, per_op.item(), world)
    if local_rank == 0:
        print(f"{BUSBW_MARKER}{busbw:.3f}", flush=True)
    dist.destroy_process_group()
    return 0


def verdict(log_path, floor_gbps, efa_interfaces):
    with open(log_path) as f:
        problems = efa_check_problems(f.read(), floor_gbps, efa_interfaces)
    for p in problems:
        print("EFA CHECK FAILED:", p, file=sys.stderr)
    if not problems:
        print("EFA check passed")
    return 1 if problems else 0


def main(argv=None):
    parser = argparse.ArgumentParser(description="The EFA check's all-reduce and verdict.")
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("run", help="the all-reduce, on every GPU under torchrun")
    judge = sub.add_parser("verdict", help="judge the run's log")
    judge.add_argument("log")
    judge.add_argument("--floor-gbps", type=float, required=True, help="lowest acceptable bus bandwidth, GB/s")
    judge.add_argument("--efa-interfaces", type=int, required=True, help="EFA interfaces per pod (0: no EFA expected)")
    args = parser.parse_args(argv)
    if args.step == "run":
        return run()
    return verdict(args.log, args.floor_gbps, args.efa_interfaces)


if __name__ == "__main__":
    sys.exit(main())
