#!/usr/bin/env bash
# Main job: installs what is missing, builds, and runs a local heterogeneous
# cluster that trains a model and prints the result. Extra arguments go to
# `hetps launch` (e.g. --summary-json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
exec build/hetps launch examples/quickstart.yaml "$@"
