#!/usr/bin/env bash
# The run command: installs the dependencies, builds, and runs the main job.
#
# Status: the training engine is not built yet (see README, "Status"). What exists today is the
# runtime's foundation and `zero-train --validate`, so this script validates the default job's
# config on one rank and on two MPI ranks, printing the effective config, and says so.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${ZERO_BUILD_DIR:-$root/build}
config=${1:-$root/configs/default.json}
mpirun_flags=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)

echo "== zero-train: training is not implemented yet; validating the default job's config instead"
echo "== 1 rank: $build/zero-train --config $config --validate"
"$build/zero-train" --config "$config" --validate
echo "== 2 ranks: mpirun -np 2 zero-train --config $config --validate"
mpirun "${mpirun_flags[@]}" -np 2 "$build/zero-train" --config "$config" --validate >/dev/null
echo "== the default config is valid on 1 and 2 ranks; training arrives with the engine"
