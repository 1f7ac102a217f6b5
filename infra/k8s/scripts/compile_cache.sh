#!/bin/sh
# Keeps a serving pod's compile cache (torch.compile/Inductor, Triton, DeepGEMM,
# FlashInfer and CUDA JIT output on the node's disk; infra/k8s/raycluster.py,
# "Compile cache") within its budget: every serving pod's first init container.
# POSIX sh: runs in any image.
#
#   sh compile_cache.sh DIR BUDGET_BYTES
#
# Creates DIR, prints what it holds, and empties it when it holds more than
# BUDGET_BYTES (the next start compiles again and refills it). vLLM keys its
# entries by a hash of the model, the configuration and the code, so a changed
# deployment adds entries and never reuses stale ones; only the size needs a bound.
set -eu
dir="$1"
budget="$2"
mkdir -p "$dir"
used_kib=$(du -sk "$dir" | cut -f1)
used=$((used_kib * 1024))
if [ "$used" -gt "$budget" ]; then
  echo "compile cache $dir holds $used bytes, over its budget of $budget: emptying it (the next start compiles again)"
  find "$dir" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
else
  echo "compile cache $dir holds $used bytes of its $budget"
fi
