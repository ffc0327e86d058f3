#!/usr/bin/env bash
# The PyTorch job: installs what is missing, builds (the hetps Python module
# included), and runs DeepFM written in PyTorch on MovieLens with its
# embedding rows on hetps: 2 servers, 4 Python workers in semi_async, two of
# them emulating slower machines. Extra arguments go to `hetps launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
export PYTHONPATH="$PWD/build/python${PYTHONPATH:+:$PYTHONPATH}"
exec build/hetps launch examples/torch/deepfm_movielens.yaml "$@"
