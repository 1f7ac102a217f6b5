"""Waits until Ray reports GPUS GPUs on NODES live nodes; exits 1 after TIMEOUT_S (ray_head.sh runs it).

    python3 ray_wait.py GPUS NODES TIMEOUT_S

Connects to the running Ray (RAY_ADDRESS, else "auto") and prints what it sees
whenever that changes.
"""

import argparse
import os
import sys
import time

POLL_S = 5


def main(argv=None):
    parser = argparse.ArgumentParser(description="Wait until Ray reports every GPU node.")
    parser.add_argument("gpus", type=int, help="GPUs Ray must report")
    parser.add_argument("nodes", type=int, help="live GPU nodes Ray must report")
    parser.add_argument("timeout_s", type=int, help="give up after this many seconds")
    args = parser.parse_args(argv)
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
    deadline = time.monotonic() + args.timeout_s
    last = None
    while True:
        gpu_nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
        gpus = sum(n["Resources"]["GPU"] for n in gpu_nodes)
        seen = (int(gpus), len(gpu_nodes))
        if seen != last:
            print(f"Ray reports {seen[0]}/{args.gpus} GPUs on {seen[1]}/{args.nodes} nodes", flush=True)
            last = seen
        if gpus >= args.gpus and len(gpu_nodes) >= args.nodes:
            break
        if time.monotonic() >= deadline:
            print(
                f"gave up after {args.timeout_s} s: Ray reports {seen[0]}/{args.gpus} GPUs on "
                f"{seen[1]}/{args.nodes} nodes; check the worker pods",
                file=sys.stderr,
                flush=True,
            )
            return 1
        time.sleep(POLL_S)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
