#!/usr/bin/env bash
# The layout rules of docs/design.md, checked on the sources (scripts/test.sh runs it before the
# build, so a violation fails in a second):
#   - dependencies point down: core < collectives < optim < offload < models, with runtime/ the
#     top. core/ includes nothing of the project outside core/; collectives/, optim/, offload/
#     and models/ include only the folders below them (models/ only core/ and collectives/, for
#     the tensor-parallel Units' all-reduces) and never
#     runtime/;
#   - no source file outside tests/ is longer than 800 lines (one concern per file; split it).
# A project include is `#include "x/..."` whose x is a top-level folder; any other quoted include
# that names an existing file relative to the including file counts as that file. Prints every
# violation as file:line and the rule it breaks, and exits 1; else "layout: ok (N files checked)".
#   scripts/check-layout.sh [ROOT]   (default: this checkout)
set -euo pipefail
root=${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
cd "$root"

max_lines=800
order="core < collectives < optim < offload < models"
# What each lower folder may include of the project (itself included). runtime/ (the top), tests/,
# bench/ may include anything.
declare -A allowed=(
  [core]="core"
  [collectives]="core collectives"
  [optim]="core collectives optim"
  [offload]="core collectives optim offload"
  [models]="core collectives models"
)

# Every source file outside tests/, build directories and hidden ones, relative to the root.
mapfile -t files < <(find . \( -path './.*' -o -path ./build -o -path './build-*' -o -path ./tests \) -prune -o \
  -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name '*.h' \) -print |
  sed 's#^\./##' | LC_ALL=C sort)

violations=0
fail() {
  echo "$1" >&2
  violations=$((violations + 1))
}

include_re='^[[:space:]]*#[[:space:]]*include[[:space:]]*"([^"]+)"'
for f in "${files[@]}"; do
  lines=$(wc -l < "$f")
  if ((lines > max_lines)); then
    fail "$f: $lines lines: a source file outside tests/ has at most $max_lines (split it by concern)"
  fi

  folder=${f%%/*}
  [[ -n ${allowed[$folder]+set} ]] || continue
  n=0
  while IFS= read -r text; do
    n=$((n + 1))
    [[ $text =~ $include_re ]] || continue
    inc=${BASH_REMATCH[1]}
    target=${inc%%/*}
    if [[ $inc != */* || ! -d $target ]]; then
      # Not the "folder/..." form: relative to the including file, if it names a file at all
      # (otherwise a system or generated header: not the project's).
      resolved=$(realpath -m --relative-to=. "$(dirname "$f")/$inc")
      [[ -e $resolved && $resolved != ../* ]] || continue
      target=${resolved%%/*}
    fi
    [[ " ${allowed[$folder]} " == *" $target "* ]] && continue
    where="$f:$n: #include \"$inc\""
    if [[ $folder == core ]]; then
      fail "$where: core/ includes nothing of the project outside core/ (it is the ground floor)"
    elif [[ $target == runtime ]]; then
      fail "$where: $folder/ must not include runtime/ (runtime/ is the top: config, engine, checkpoint, zero-train)"
    else
      may=$(sed -E 's#$#/#; s# #/, #g; s#, ([^,]*)$# and \1#' <<<"${allowed[$folder]}")
      fail "$where: $folder/ may include only $may of the project (dependencies point down: $order)"
    fi
  done < "$f"
done

if ((violations > 0)); then
  echo "layout: $violations violation(s) in ${#files[@]} files checked (docs/design.md, 'Layout and dependency direction')" >&2
  exit 1
fi
echo "layout: ok (${#files[@]} files checked)"
