#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs a local cluster
# (2 servers, 4 workers) that trains DeepFM on MovieLens and prints test AUC,
# logloss and throughput. Extra arguments go to `hetps launch`
# (e.g. --summary-json out.json, --set train.epochs=1).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
exec build/hetps launch examples/movielens.yaml "$@"
