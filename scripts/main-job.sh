#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a local mixed
# cluster (2 servers; 4 workers emulating two fast and two slow machines,
# one of them slowed down midway) that trains DeepFM on MovieLens in
# semi_async (examples/main-job.yaml). The terminal shows a progress line
# and the summary (test AUC, throughput, each worker's batch and busy
# share); every role's log and summary.json go to runs/<job>-<time>/.
# Extra arguments go to `hetps launch` (e.g. -v, --summary-json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
exec build/hetps launch examples/main-job.yaml "$@"
