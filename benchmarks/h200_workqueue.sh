#!/usr/bin/env bash
# The work queue's checks on a coarse-grain-only GPU (NVIDIA's OpenCL on an H200: no
# fine-grain SVM, no SVM atomics).  Runs, from a source checkout with svmkit installed:
#   - the demo three times with --json: it must say "mode": "batched" and "verified": true;
#   - benchmarks/workqueue.py --quick: the batched coarse-grain rows (pipelined >= 100 M
#     items/s at batch 4096; sync p50 per batch within 10% of raw PyOpenCL's copy + launch
#     + copy, measured in the same run); the queue rows are skipped, saying so.
# Pass --write to update this machine's section of benchmarks/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
for run in 1 2 3; do
    echo "== svmkit demo workqueue --json (run $run)"
    svmkit demo workqueue --json --no-progress | tail -n 1
done
echo "== python benchmarks/workqueue.py --quick $*"
python benchmarks/workqueue.py --quick "$@"
