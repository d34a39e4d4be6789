#!/usr/bin/env bash
# Install what tests/slurm_cluster.py runs: Debian's Slurm daemons, its client commands and munge.
# Idempotent: does nothing when the binaries are already there.
set -euo pipefail

missing=()
for binary in slurmctld slurmd srun sinfo scontrol munged; do
    if ! command -v "$binary" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$binary" ]; then
        missing+=("$binary")
    fi
done
if [ "${#missing[@]}" -eq 0 ]; then
    exit 0
fi

packages=(slurmctld slurmd slurm-client munge)
if [ "${EUID}" -ne 0 ]; then
    echo "missing ${missing[*]}: as root, run apt-get install -y --no-install-recommends ${packages[*]}" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${packages[@]}"
