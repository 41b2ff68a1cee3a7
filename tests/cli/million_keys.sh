#!/usr/bin/env bash
# Writes a config of a million top-level keys into the build tree (never committed) and runs
# zero-train --validate on it: reading must be linear in the file's size.
#   million_keys.sh ZERO_TRAIN OUT_DIR
set -euo pipefail
zt=$1
out=$2/million_keys.json
awk 'BEGIN {
  printf "{\"train_batch_size\": 8"
  for (i = 0; i < 1000000; i++) printf ", \"k%d\": %d", i, i
  print "}"
}' > "$out"
exec "$zt" --config "$out" --validate
