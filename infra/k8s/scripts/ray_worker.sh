#!/bin/bash
# A Ray worker's container (infra/k8s/raycluster.py, worker_command):
# checks the locked-memory limit EFA needs (memlock_check.py), then execs
# KubeRay's generated, blocking `ray start` unchanged.
#
#   bash ray_worker.sh REQUIRE_MEMLOCK
#
# REQUIRE_MEMLOCK: 1 on EFA nodes (a failed check stops the container), 0 otherwise.
set -euo pipefail
require="$1"
: "${KUBERAY_GEN_RAY_START_CMD:?KubeRay did not set KUBERAY_GEN_RAY_START_CMD: is the ray.io/overwrite-container-cmd annotation on the worker template?}"
# The soft limit may rise to the hard one without privileges.
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
if [ "$require" = 1 ]; then
  python3 "$(dirname "$0")/memlock_check.py" --require
else
  python3 "$(dirname "$0")/memlock_check.py"
fi
echo "starting Ray: ${KUBERAY_GEN_RAY_START_CMD}"
exec /bin/bash -c "${KUBERAY_GEN_RAY_START_CMD}"
