#!/bin/sh
# Waits until the weight-staging Job's completion marker exists (stage_weights.py
# writes it last). POSIX sh: runs in any image.
#
#   sh wait_for_weights.sh MARKER TIMEOUT_S INTERVAL_S
#
# Exits 0 once MARKER exists; with TIMEOUT_S > 0 it gives up after that long and
# exits 1 (the pod then restarts and waits again), 0 waits for ever.
marker="$1"
timeout="$2"
interval="$3"
waited=0
while [ ! -f "$marker" ]; do
  if [ "$timeout" -gt 0 ] && [ "$waited" -ge "$timeout" ]; then
    echo "model weights not staged after ${waited}s: no $marker" >&2
    exit 1
  fi
  echo "waiting for the model weights: $marker"
  sleep "$interval"
  waited=$((waited + interval))
done
echo "model weights ready: $marker"
