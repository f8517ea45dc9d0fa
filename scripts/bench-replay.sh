#!/usr/bin/env bash
# Reproduces BENCHMARKS.md "Replay evaluation" (issue 6) from nothing but this repository
# and ../shared/bench: LoCoMo observations with cursorrules_bullets as distractors, 20
# conversations; first with the hook's defaults, whose advice is written to OUT's config
# (--apply), then that advice measured on the same conversations (seed 0) and on unseen
# ones (seed 1). Each run prints its table; the JSON and HTML reports land in OUT.
#
#   scripts/bench-replay.sh [OUT]        (OUT defaults to .bench/replay)
#
# BENCH names the bench folder (default ../shared/bench beside the repo); RELAY names the
# relay command (default .venv/bin/relay). The loaded database is kept in OUT/work and
# reused by the later runs, so only the first one embeds the ~7,000 memories.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$(mkdir -p "${1:-$ROOT/.bench/replay}" && cd "${1:-$ROOT/.bench/replay}" && pwd)
BENCH=${BENCH:-$ROOT/../shared/bench}
RELAY=${RELAY:-$ROOT/.venv/bin/relay}
L=$BENCH/locomo_observations
D=$BENCH/cursorrules_bullets
ADVICE=$OUT/advised-locomo.json
rm -f "$ADVICE"

run() {  # NAME, then the flags of relay eval replay
  local name=$1
  shift
  echo "== $name ($(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg))"
  "$RELAY" eval replay "$L" --distractors "$D" --conversations 20 --workdir "$OUT/work" \
    --json "$OUT/$name.json" --report-dir "$OUT/$name" "$@"
}

RELAY_CONFIG=$ADVICE run defaults --seed 0 --apply
echo "== advice written to $ADVICE:"
cat "$ADVICE"
echo
run advised-seed0 --seed 0 --config "$ADVICE"
run advised-seed1 --seed 1 --config "$ADVICE"
