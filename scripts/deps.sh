#!/usr/bin/env bash
# Installs the Debian packages hetps builds with, when any is missing.
set -euo pipefail
packages=(
  cmake ninja-build g++ pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libcli11-dev libyaml-cpp-dev
  libeigen3-dev nlohmann-json3-dev libxxhash-dev
  prometheus-cpp-dev libcpp-httplib-dev  # /metrics and the dashboard
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev  # scripts/fuzz.sh: clang++ and libFuzzer
  iproute2  # ip netns and tc: the test hosts of tests/netns/
  openmpi-bin  # mpirun: tests/launchers/mpirun_test.sh
  prometheus  # tests/metrics/prometheus_test.py scrapes a running job
  chromium chromium-driver python3-selenium  # tests/metrics/dashboard_test.py
  # The Python module (python/) and its tests: Debian's python3 with numpy,
  # PyTorch (CPU) and pytest.
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
  python3-yaml  # tests/launchers/k8s_check.py
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
