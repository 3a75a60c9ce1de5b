#!/usr/bin/env bash
# Installs the Debian packages kvengine needs to build, test and benchmark.
# Idempotent, and quiet when everything is already present.
#   scripts/bootstrap.sh           build + tests (C++ and Python)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libxxhash-dev libgflags-dev libgtest-dev libgmock-dev libbenchmark-dev
  libnuma-dev liburing-dev libibverbs-dev librocksdb-dev
  libucx-dev ucx-utils  # the UCX transport (transport/ucx.h) and ucx_perftest, its baseline
  libcurl4-openssl-dev nlohmann-json3-dev  # the etcd client (cluster membership)
  etcd-server  # the cluster tests start a private etcd (Debian 12: 3.4)
  python3-dev pybind11-dev python3-numpy python3-pytest
  python3-prometheus-client  # vLLM's metrics path in the connector tests (prometheus_client)
  python3-msgpack  # the vLLM connector tests encode KV event batches as vLLM's msgpack publisher does
  python3-venv python3-pip python3-setuptools python3-wheel  # pip install . (pyproject.toml) and its test, offline
  clang libclang-rt-14-dev  # the fuzz targets (test/fuzz): clang and its libFuzzer (Debian 12)
  libcpp-httplib-dev  # the HTTP client of the metrics endpoint's tests (test/metrics_test.cc)
  libre2-dev  # DeleteByRegex's pattern matcher (util/key_pattern.h)
  prometheus  # promtool and a real Prometheus scraping kv_server in metrics_test
)
# torch (CPU) for the tensor and vLLM-connector tests: measured on Debian 12, 171 packages,
# 142 MB to download, about 1.5 minutes to install.  KV_BOOTSTRAP_NO_TORCH=1 skips it
# (those tests then skip, saying why).
[[ "${KV_BOOTSTRAP_NO_TORCH:-0}" == "1" ]] || packages+=(python3-torch)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "bootstrap: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
