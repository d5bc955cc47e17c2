#!/usr/bin/env bash
# Runs the README's quick start as written (the block between the quickstart markers), from the
# repository root, with `build/shardlab` read as BUILD/shardlab (default build) and QS set to
# QSDIR (default: a fresh temporary directory). The `quickstart` test runs it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
export QS=${2:-$(mktemp -d)}
block=$(sed -n '/<!-- quickstart:begin -->/,/<!-- quickstart:end -->/p' "$root/README.md" | sed '/^<!--/d; /^```/d')
[ -n "$block" ] || { echo "run-quickstart: no quickstart block in README.md" >&2; exit 1; }
cd "$root"
bash -euo pipefail -c "${block//build\/shardlab/$build/shardlab}"
echo "run-quickstart: every line ran"
