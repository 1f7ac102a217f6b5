"""Checks that this container's processes can register the memory EFA needs (the Ray head and workers run it first).

    python3 memlock_check.py [--require] [--status FILE] [--meminfo FILE]

libfabric's EFA provider pins host buffers (bounce buffers, registered memory
regions); the kernel's `ib_umem_get` refuses a pin beyond RLIMIT_MEMLOCK unless
the process holds CAP_IPC_LOCK. Kubernetes has no ulimit field: on EFA nodes the
stack raises the limit in containerd's base runtime spec (AL2023: the nodeadm
NodeConfig of the launch template, infra/aws/gpu_nodes.py; Bottlerocket does it
by itself when EFA is attached), so the serving containers need neither root nor
IPC_LOCK. Without it a container starts with the kernel's default (64 KiB before
Linux 5.16, 8 MiB after): far too little, and NCCL then fails with "Cannot
allocate memory" or falls back. This checks the result in the process tree that
runs Ray and vLLM: the limit is unlimited or covers all of the node's memory
(nothing can pin more), or CAP_IPC_LOCK is effective.

Prints the limit, the node's memory and the capability; with --require (EFA
nodes) exits 1 with the fix when none holds. Standard library only.
"""

import argparse
import resource
import sys

CAP_IPC_LOCK = 14  # linux/capability.h


def cap_effective(status_text):
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def mem_total_bytes(meminfo_text):
    """MemTotal of /proc/meminfo (in kB there), in bytes; 0 when absent."""
    for line in meminfo_text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def describe(limit):
    return "unlimited" if limit == resource.RLIM_INFINITY else "%d KiB" % (limit // 1024)


def memlock_problem(soft, hard, cap_eff, mem_total):
    """Why EFA memory registration would fail here (None: it would not)."""
    if soft == resource.RLIM_INFINITY or (mem_total and soft >= mem_total) or cap_eff & (1 << CAP_IPC_LOCK):
        return None
    return (
        "locked-memory limit is %s (hard %s), below the node's %s, and the process lacks CAP_IPC_LOCK: EFA "
        "cannot register its buffers. The node's containerd base runtime spec should raise RLIMIT_MEMLOCK "
        "(the GPU launch template's nodeadm NodeConfig, spec.containerd.baseRuntimeSpec): check the node's "
        "user data and /etc/containerd/base-runtime-spec.json" % (describe(soft), describe(hard), describe(mem_total))
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description="Check the locked-memory limit EFA memory registration needs.")
    parser.add_argument("--require", action="store_true", help="exit 1 when EFA could not register its memory")
    parser.add_argument("--status", default="/proc/self/status", help="the process status file to read CapEff from")
    parser.add_argument("--meminfo", default="/proc/meminfo", help="the file to read the node's MemTotal from")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    with open(args.status) as f:
        cap_eff = cap_effective(f.read())
    with open(args.meminfo) as f:
        mem_total = mem_total_bytes(f.read())
    has_cap = bool(cap_eff & (1 << CAP_IPC_LOCK))
    print("max locked memory: %s (hard %s); node memory %s; CAP_IPC_LOCK %s"
          % (describe(soft), describe(hard), describe(mem_total), "effective" if has_cap else "absent"), flush=True)
    problem = memlock_problem(soft, hard, cap_eff, mem_total)
    if problem is None:
        return 0
    if args.require:
        print("EFA MEMLOCK CHECK FAILED: " + problem, file=sys.stderr, flush=True)
        return 1
    print("note: " + problem, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
