#!/usr/bin/env bash
# Issue 37 item 4: real builds at the frontier on the Docker engine of this CPU machine (no GPU), pypi
# flavor, one arch: each catalogue package that needed the C++20 fix, built for a torch whose headers
# refuse C++17, verified and imported in its builder image by `imagegen build`; then the same cell with
# the fix taken out of the recipe (a --recipe-dir copy, as a user patches a recipe), refused by the
# pre-flight: the recipe without its by_torch entry by the plan's standard check, and the recipe that
# claims C++20 without the patch by the gencode audit's header probe in the builder image.
#   bash benchmarks/frontier_builds.sh RESULTS_DIR 'RECIPE|SOURCE|TORCH[|VERSION]' ...   (RECIPE: the catalogue name)
# SOURCE: a local tree (--source) or file:///mirror@REF (--git). Python 3.11 on the local test base image
# (scripts/make-base-image.sh; no registry here). Results: RESULTS_DIR/<recipe>-torch<T>/{build.out,
# build.err,times.json,plan-nofix.*,audit-claims20.*}; docs/records/verification.md has the figures.
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
imagegen=${IMAGEGEN:-$here/.venv/bin/imagegen}
results=${1:?results folder}
shift
base=${IMAGEGEN_TEST_BASE_IMAGE:-imagegen-test/python:3.11-bookworm}
arch=${FRONTIER_ARCH:-9.0}

for spec in "$@"; do
  IFS='|' read -r recipe source torch version <<<"$spec"
  dir="$results/$recipe-torch$torch"
  mkdir -p "$dir"
  if [[ $source == file://* ]]; then
    src=(--git "$source" --version "${source##*@v}")
  else
    src=(--source "$source")  # a tree whose version imagegen cannot read statically: VERSION, the 4th field
    [ -n "$version" ] && src+=(--version "$version")
  fi
  cell=("${src[@]}" --torch "$torch" --python 3.11 --flavor pypi --base-image "$base" --arch "$arch")
  [[ $source == file://* ]] && cell=("$recipe" "${cell[@]}")
  echo "== $recipe torch $torch ($source) $(date -u +%T)"
  if [ -z "${FRONTIER_SKIP_BUILD:-}" ]; then  # FRONTIER_SKIP_BUILD=1: only the fix-disabled refusals
  python3 - "$dir/times.json" "$imagegen" build "${cell[@]}" --out "$dir/wheelhouse" --work "$dir/work" \
      > "$dir/build.out" 2> "$dir/build.err" <<'PY'
import json, resource, subprocess, sys, time
t0 = time.time(); rc = subprocess.call(sys.argv[2:]); t1 = time.time()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
# The compile runs in BuildKit (dockerd's children), not here: CPU seconds are the engine's, read
# from the build log's timings by the caller; this records the wall time and imagegen's own exit.
json.dump({"rc": rc, "wall_s": round(t1 - t0, 1)}, open(sys.argv[1], "w"))
sys.exit(rc)
PY
  echo "build exit $? $(date -u +%T)"
  fi
  # The fix taken out: a recipe folder holding the catalogue recipe without its by_torch entry, and
  # one claiming cxx_std 20 without the patch that makes it true.
  name=$recipe  # the catalogue name (its file resources/recipes/NAME.yaml)
  for variant in nofix claims20; do
    rdir="$dir/recipes-$variant"
    mkdir -p "$rdir"
    python3 - "$here/imagegen/resources/recipes/$name.yaml" "$rdir/$name.yaml" "$variant" <<'PY'
import sys, yaml
src, dst, variant = sys.argv[1:]
doc = yaml.safe_load(open(src))
def strip(facts):
    rules = facts.pop("by_torch", None) or []
    if variant == "claims20" and rules:
        facts["cxx_std"] = 20
ranges = doc.get("by_version") or []  # a list of {match, ...facts}
for facts in [*(ranges.values() if isinstance(ranges, dict) else ranges), *(doc.get("versions") or {}).values()]:
    if isinstance(facts, dict):
        strip(facts)
yaml.safe_dump(doc, open(dst, "w"), sort_keys=False)
PY
    # The recipe's patches live beside it (a recipe folder's files are read only inside it: no link).
    rm -rf "$rdir/patches" && cp -r "$here/imagegen/resources/recipes/patches" "$rdir/patches"
  done
  "$imagegen" plan "${cell[@]}" --recipe-dir "$dir/recipes-nofix" > "$dir/plan-nofix.out" 2> "$dir/plan-nofix.err"
  echo "plan without the fix: exit $?"
  "$imagegen" plan --audit "${cell[@]}" --recipe-dir "$dir/recipes-claims20" --work "$dir/work-claims20" \
    > "$dir/audit-claims20.out" 2> "$dir/audit-claims20.err"
  echo "audit of the recipe claiming C++20 without the patch: exit $?"
done
