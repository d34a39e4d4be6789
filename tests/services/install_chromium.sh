#!/usr/bin/env bash
# Install what the HTML timeline's tests (tests/report/chromium.py) run: Debian's headless-capable
# `chromium`. Idempotent: does nothing when /usr/bin/chromium is already there.
set -euo pipefail

if [ -x /usr/bin/chromium ]; then
    exit 0
fi
if [ "${EUID}" -ne 0 ]; then
    echo "missing chromium: as root, run apt-get install -y --no-install-recommends chromium" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends chromium
