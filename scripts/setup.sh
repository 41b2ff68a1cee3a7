#!/usr/bin/env bash
# Installs every dependency of the project from Debian's own packages, by name. Idempotent: a
# second run that finds everything installed does nothing and touches no network. Tolerates a
# dpkg lock held by another apt process (waits up to 5 minutes for it).
#
#   scripts/setup.sh            install what is missing
#   scripts/setup.sh --check    only report what is missing; exit 1 if anything is
#
# Catch2 v3 exists only in bookworm-backports; this script derives a backports source from the
# machine's own Debian source entry (same mirror, Suites changed) and installs that one package
# from it, so nothing else moves to backports.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  openmpi-bin libopenmpi-dev          # MPI world, host collectives, mpirun for multi-rank tests
  libtbb-dev                          # oneTBB: host thread pools (AdamW, cpu kernels)
  nlohmann-json3-dev                  # ds_config.json parsing
  libopenblas-dev                     # CPU BLAS for the cpu backend
  libdnnl-dev                         # oneDNN: the cpu backend's bf16 (and fp32) matrix products
  ocl-icd-opencl-dev                  # only a Recommends of libdnnl-dev, but its CMake config needs OpenCL
  python3                             # test scripts: metrics comparison, a safetensors reader
  liburing-dev                        # io_uring: the NVMe tier's asynchronous file engine
  fio                                 # bench/nvme_io's reference: the drive's bandwidth, same run
)
backport_packages=(libcatch2-dev)     # Catch2 v3 (bookworm main has only v2)

apt_get() { $SUDO apt-get -o DPkg::Lock::Timeout=300 "$@"; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: not root and no sudo: run it as root" >&2; exit 1; }
  SUDO="sudo"
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'; }

catch2_is_v3() {
  local v
  v=$(dpkg-query -W -f='${Version}' libcatch2-dev 2>/dev/null) || return 1
  dpkg --compare-versions "$v" ge 3
}

missing=()
for p in "${packages[@]}"; do installed "$p" || missing+=("$p"); done
need_catch2=0
catch2_is_v3 || need_catch2=1

if [ "${1:-}" = "--check" ]; then
  [ ${#missing[@]} -eq 0 ] && [ $need_catch2 -eq 0 ] && { echo "setup: all dependencies present"; exit 0; }
  echo "setup: missing: ${missing[*]} $([ $need_catch2 -eq 1 ] && echo 'libcatch2-dev(v3)')"
  exit 1
fi

if [ ${#missing[@]} -eq 0 ] && [ $need_catch2 -eq 0 ]; then
  echo "setup: all dependencies already installed"
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
[ -n "$codename" ] || { echo "setup: cannot read VERSION_CODENAME from /etc/os-release" >&2; exit 1; }

# Derive a backports source from the existing Debian entry unless one is already configured.
add_backports_source() {
  local bp="${codename}-backports"
  if grep -rqsE "(^|[[:space:]])${bp}([[:space:]]|$)" /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null; then
    return 0
  fi
  local deb822=/etc/apt/sources.list.d/debian.sources
  local out
  if [ -f "$deb822" ]; then
    # First stanza whose Suites line names the plain release: copy it with Suites replaced.
    out=$(awk -v rel="$codename" -v bp="$bp" '
      BEGIN { RS=""; FS="\n" }
      {
        keep = 0
        for (i = 1; i <= NF; i++) if ($i ~ "^Suites:" && (" " $i " ") ~ (" " rel " ")) keep = 1
        if (!keep || done) next
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^#/) continue
          if ($i ~ /^Suites:/) print "Suites: " bp; else print $i
        }
        done = 1
      }' "$deb822")
    [ -n "$out" ] || { echo "setup: no '$codename' stanza in $deb822 to derive backports from" >&2; exit 1; }
    echo "$out" | $SUDO tee /etc/apt/sources.list.d/zero-backports.sources >/dev/null
  elif [ -f /etc/apt/sources.list ]; then
    out=$(awk -v rel="$codename" -v bp="$bp" '$1=="deb" && $3==rel { $3=bp; print; exit }' /etc/apt/sources.list)
    [ -n "$out" ] || { echo "setup: no 'deb ... $codename' line in /etc/apt/sources.list to derive backports from" >&2; exit 1; }
    echo "$out" | $SUDO tee /etc/apt/sources.list.d/zero-backports.list >/dev/null
  else
    echo "setup: no Debian source entry found to derive a backports source from" >&2; exit 1
  fi
  echo "setup: added a ${bp} source derived from the machine's Debian entry"
}

[ $need_catch2 -eq 1 ] && add_backports_source
apt_get update -q
[ ${#missing[@]} -gt 0 ] && apt_get install -y -q --no-install-recommends "${missing[@]}"
if [ $need_catch2 -eq 1 ]; then
  apt_get install -y -q --no-install-recommends "${backport_packages[@]/%//${codename}-backports}"
fi
catch2_is_v3 || { echo "setup: libcatch2-dev v3 did not install" >&2; exit 1; }
echo "setup: done"
