#!/usr/bin/env bash
# Installs the Debian 12 packages lockstep builds with. Idempotent: quiet when all are present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  capnproto libcapnp-dev
  librapidcheck-dev libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libxxhash-dev libfmt-dev
  pybind11-dev python3-dev python3-numpy python3-pytest
  chromium  # headless, for the test that renders `lockstep report` (cli_report_in_chromium)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
