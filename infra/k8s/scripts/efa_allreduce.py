"""The EFA check's NCCL all-reduce and its verdict (efa_check.sh runs both).

    torchrun ... efa_allreduce.py run
        on every GPU: all-reduces of SIZE_BYTES over NCCL (torch.distributed);
        local rank 0 prints BUSBW_MARKER and the bus bandwidth in GB/s
    python3 efa_allreduce.py verdict LOG --floor-gbps F --efa-interfaces N
        exits 1 with the reasons when the run's log shows no EFA, a fallback
        to NCCL's Socket (TCP) transport, or a bus bandwidth below F
        (`efa_check_problems`)

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


# What NCCL (INIT,NET subsystems) and aws-ofi-nccl print (every plugin line is prefixed
# "NET/OFI "). Never anchored at the start of a line: Ray and kubectl prefix lines, and
# WARN lines may begin with a timestamp.
# - the plugin picked EFA: "Selected Provider is efa (found N nics)" up to aws-ofi-nccl
#   1.13.x, "Selected provider is efa, fabric is efa[-direct] (found N nics)" from 1.14;
# - a communicator's network: "Using network Libfabric" ("AWS Libfabric" before 1.13),
#   or "Using network Socket" when NCCL fell back to TCP;
# - each channel's transport: "via NET/Libfabric/<dev>[/GDRDMA]" or "via NET/Socket/<dev>".
EFA_SELECTED = re.compile(r"NET/OFI Selected [Pp]rovider is efa\b")
PLUGIN_FAILED = re.compile(
    r"NET/OFI (No eligible providers were found|aws-ofi-nccl initialization failed|Could not find any optimal provider)"
)
LIBFABRIC_CHANNEL = re.compile(r"via NET/(AWS )?Libfabric/\d+")
SOCKET_USED = re.compile(r"Using network Socket\b|via NET/Socket/\d+")
IB_USED = re.compile(r"Using network IB\b|via NET/IB/\d+")


def efa_check_problems(log_text, floor_gbps, efa_interfaces):
    """Why an EFA check run failed (empty: it passed), from its log.

    With EFA interfaces, the log must show aws-ofi-nccl selecting the EFA
    provider, the all-reduce's channels going through it (`via NET/Libfabric/`),
    and nothing through NCCL's Socket (TCP) or IB transports; in every case the
    all-reduce's bus bandwidth (the BUSBW_MARKER line) at or above the floor.
    """
    problems = []
    if efa_interfaces > 0:
        failed = PLUGIN_FAILED.search(log_text)
        if failed:
            problems.append(
                "aws-ofi-nccl found no usable EFA provider (%r): the pod got no EFA devices, or libfabric "
                "cannot open them" % failed.group(0)
            )
        if not EFA_SELECTED.search(log_text):
            problems.append(
                "NCCL did not select the EFA provider (no 'NET/OFI Selected provider is efa' in the log): "
                "the image lacks libfabric/aws-ofi-nccl, or the pod got no EFA devices"
            )
        if not LIBFABRIC_CHANNEL.search(log_text):
            problems.append("no NCCL channel went through EFA (no 'via NET/Libfabric/' line)")
        if IB_USED.search(log_text):
            problems.append("NCCL used its IB transport, not EFA through aws-ofi-nccl")
    sockets = SOCKET_USED.findall(log_text)
    if sockets:
        channels = len(re.findall(r"via NET/Socket/\d+", log_text))
        problems.append("NCCL fell back to its Socket transport (TCP), not EFA: %d channel(s) via NET/Socket" % channels)
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
