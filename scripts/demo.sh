#!/usr/bin/env bash
# The main job, from a fresh machine: install what is missing, then boot a
# VMI from a manifest end to end with `virt-handler standalone` (no cluster).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
step "set-up: Debian packages and tools (scripts/setup.sh)"
bash scripts/setup.sh
exec bash images/examples/run.sh "$@"
