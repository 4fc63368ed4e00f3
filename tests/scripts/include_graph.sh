#!/usr/bin/env bash
# The layering rules of docs/ARCHITECTURE.md, checked over the source tree (run in CI as script.include_graph):
#   - src/core/ includes nothing above it (only core/ headers);
#   - src/nn/ never includes a backend (ops/cpu/, ops/cuda/) and makes no ops::cuda:: / ops::cpu:: call: layers call
#     the ops' entry points, which dispatch through the op registry;
#   - no ops::cuda:: call outside src/ops/;
#   - a backend file (src/ops/cpu/*, src/ops/cuda/*) includes from src/ops/ only op_common.h, registry.h and the header
#     of its own op (ops/NAME.h where NAME starts its file name: cuda/kda/kda_bwd.cu may include ops/kda.h);
#   - only src/train/ and src/cli/ include train/, only src/cli/ includes cli/: the layers below never see the job
#     config (the memory planner takes a MemoryPlanInput, which train/plan_input.cpp fills);
#   - src/parallel/ includes nn/ only in the planner (parallel/plan_*: it lays out the model's parameter table); the
#     rest of parallel/ works on a model-free description of the arenas (GradArenas).
# Usage: include_graph.sh <moetrain> <source-dir> <scratch-dir> (the binary and scratch are unused). Prints every
# violation and exits 1 when there is one.
set -euo pipefail
SRC=$2/src
[[ -d $SRC/core && -d $SRC/ops && -d $SRC/nn ]] || { echo "include_graph: $SRC is not the source tree" >&2; exit 1; }
cd "$SRC"
bad=0
violation() { echo "VIOLATION: $*"; bad=1; }
includes() { grep -HnE '^#include "' "$@" 2>/dev/null | sed -E 's/^([^:]+):([0-9]+):#include "([^"]+)".*/\1 \2 \3/'; }
sources() { find "$@" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort; }

checked=0
while read -r file line header; do
    checked=$((checked + 1))
    [[ $header == core/* ]] || violation "$file:$line includes $header (src/core/ may include only core/)"
done < <(includes $(sources core))

while read -r file line header; do
    checked=$((checked + 1))
    [[ $header == ops/cpu/* || $header == ops/cuda/* ]] && violation "$file:$line includes $header (src/nn/ may not include a backend)"
done < <(includes $(sources nn))

while read -r file line header; do
    checked=$((checked + 1))
    [[ $header == ops/* && $header != ops/cpu/* && $header != ops/cuda/* ]] || continue
    name=${header#ops/}; name=${name%.h}
    base=$(basename "$file"); base=${base%%.*}
    [[ $name == op_common || $name == registry || $base == "$name" || $base == "${name}"_* ]] ||
        violation "$file:$line includes $header (a backend file includes only its own op's header)"
done < <(includes $(sources ops/cpu ops/cuda))

while read -r file line header; do
    checked=$((checked + 1))
    [[ $header == train/* || $header == cli/* ]] && violation "$file:$line includes $header (only train/ and cli/ see the job config)"
done < <(includes $(sources core ops nn optim parallel data))

while read -r file line header; do
    [[ $header == cli/* ]] && violation "$file:$line includes $header (only src/cli/ includes cli/)"
done < <(includes $(sources train))

while read -r file line header; do
    [[ $header == nn/* && $(basename "$file") != plan_* ]] &&
        violation "$file:$line includes $header (in src/parallel/ only the planner, plan_*, includes nn/)"
done < <(includes $(sources parallel))

while IFS= read -r hit; do
    violation "$hit (ops::cuda:: / ops::cpu:: called outside src/ops/)"
done < <(grep -rnE '\bops::(cuda|cpu)::[a-z_]+\(' nn train parallel cli data optim || true)

(( checked > 100 )) || { echo "include_graph: only $checked includes checked; the tree walk is broken" >&2; exit 1; }
echo "include_graph: $checked includes checked"
exit $bad
