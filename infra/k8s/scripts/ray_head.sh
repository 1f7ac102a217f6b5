#!/bin/bash
# The Ray head's container (infra/k8s/raycluster.py, "The head's command"):
# starts Ray from KubeRay's generated command without --block, waits until Ray
# reports every GPU of the plan, then execs the serving command, so vLLM is the
# container's main process (when the engine dies the container exits).
#
#   bash ray_head.sh GPUS NODES TIMEOUT_S COMMAND [ARG...]
#
# GPUS, NODES, TIMEOUT_S: what ray_wait.py waits for, and how long.
set -euo pipefail
want_gpus="$1"
want_nodes="$2"
timeout_s="$3"
shift 3
ulimit -n "${RAY_START_ULIMIT_OPEN_FILES:-65536}" || echo "could not raise the open-file limit" >&2
: "${KUBERAY_GEN_RAY_START_CMD:?KubeRay did not set KUBERAY_GEN_RAY_START_CMD: is the ray.io/overwrite-container-cmd annotation on the head template?}"
# KubeRay's generated command always ends in --block; without it `ray start`
# returns once the head's processes are up and the script goes on.
ray_start="${KUBERAY_GEN_RAY_START_CMD//--block/}"
echo "starting Ray: ${ray_start}"
/bin/bash -c "${ray_start}"
python3 "$(dirname "$0")/ray_wait.py" "$want_gpus" "$want_nodes" "$timeout_s"
exec "$@"
