#!/bin/bash
# The EFA check, one pod per node of an Indexed Job (infra/k8s/checks.py):
# `fi_info -p efa` must list EFA devices, then an NCCL all-reduce across the
# Job's pods (torchrun's rendezvous at MASTER:PORT, this pod's rank the Job's
# completion index) and its verdict (efa_allreduce.py).
#
#   bash efa_check.sh NODES GPUS_PER_NODE MASTER PORT FLOOR_GBPS EFA_INTERFACES
set -uo pipefail
nodes="$1"
gpus_per_node="$2"
master="$3"
port="$4"
floor_gbps="$5"
efa_interfaces="$6"
here="$(dirname "$0")"
log="${TMPDIR:-/tmp}/allreduce.log"
# The soft limit may rise to the hard one without privileges; EFA must be able to pin its buffers.
ulimit -S -l "$(ulimit -H -l)" 2>/dev/null || true
python3 "$here/memlock_check.py" --require || exit 1
FI_INFO="$(command -v fi_info || echo /opt/amazon/efa/bin/fi_info)"  # where the EFA installer puts it
echo "== $FI_INFO -p efa"
if ! "$FI_INFO" -p efa; then
  echo "EFA CHECK FAILED: fi_info -p efa lists no EFA device (no libfabric in the image, or no EFA devices in the pod)" >&2
  exit 1
fi
torchrun --nnodes "$nodes" --nproc-per-node "$gpus_per_node" \
  --node-rank "$JOB_COMPLETION_INDEX" --master-addr "$master" --master-port "$port" \
  "$here/efa_allreduce.py" run 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then echo "EFA CHECK FAILED: the all-reduce exited with $rc" >&2; exit "$rc"; fi
exec python3 "$here/efa_allreduce.py" verdict "$log" --floor-gbps "$floor_gbps" --efa-interfaces "$efa_interfaces"
