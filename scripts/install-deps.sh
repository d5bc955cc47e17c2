#!/usr/bin/env bash
# Installs every Debian package shardlab builds, tests and benchmarks with (clang and its runtime
# only for the libFuzzer targets in tests/fuzz; python3 and procps for the fault tests in tests/faults;
# pip for scripts/fetch-gpt2-tokenizer.sh, which downloads one small sdist from PyPI).
# Idempotent: packages already present are skipped, and apt is not touched when nothing is missing.
# CUDA (nvcc, cuBLAS, NCCL, Thrust) is not a Debian package here: CMake looks for it in /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  libdnnl-dev libopenblas-openmp-dev
  libboost-program-options-dev
  catch2
  nlohmann-json3-dev
  libfmt-dev libspdlog-dev
  clang libclang-rt-14-dev
  python3 python3-pip procps
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
