#!/bin/bash
# The Ray head's container (infra/k8s/raycluster.py, "The head's command"):
# checks the locked-memory limit EFA needs (memlock_check.py), starts Ray from
# KubeRay's generated command without --block, waits until Ray reports every
# GPU of the plan, then execs the serving command, so vLLM is the container's
# main process (when the engine dies the container exits).
#
#   bash ray_head.sh GPUS NODES TIMEOUT_S REQUIRE_MEMLOCK COMMAND [ARG...]
#
# GPUS, NODES, TIMEOUT_S: what ray_wait.py waits for, and how long.
# REQUIRE_MEMLOCK: 1 on EFA nodes (a failed check stops the container), 0 otherwise.
set -euo pipefail
want_gpus="$1"
want_nodes="$2"
timeout_s="$3"
require_memlock="$4"
shift 4
here="$(dirname "$0")"
ulimit -n "${RAY_START_ULIMIT_OPEN_FILES:-65536}" || echo "could not raise the open-file limit" >&2
# The soft limit may rise to the hard one without privileges.
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
if [ "$require_memlock" = 1 ]; then
  python3 "$here/memlock_check.py" --require
else
  python3 "$here/memlock_check.py"
fi
: "${KUBERAY_GEN_RAY_START_CMD:?KubeRay did not set KUBERAY_GEN_RAY_START_CMD: is the ray.io/overwrite-container-cmd annotation on the head template?}"
# KubeRay's generated command always ends in --block; without it `ray start`
# returns once the head's processes are up and the script goes on.
ray_start="${KUBERAY_GEN_RAY_START_CMD//--block/}"
echo "starting Ray: ${ray_start}"
/bin/bash -c "${ray_start}"
python3 "$here/ray_wait.py" "$want_gpus" "$want_nodes" "$timeout_s"
# The API key guard the serving command loads with --middleware (api_guard.py) is in this folder; the key
# comes from the Secret's file into the variable vLLM and the guard read (only this process sees it).
export PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}"
if [ -n "${GPU_SERVING_API_KEY_FILE:-}" ]; then
  VLLM_API_KEY="$(cat "$GPU_SERVING_API_KEY_FILE")"
  export VLLM_API_KEY
fi
exec "$@"
