#!/usr/bin/env bash
# Build one catalogue version natively with imagegen on this GPU host, then run its recipe's GPU check
# (docs/records/verification.md): scripts/gpu/build_check.sh RECIPE VERSION SRC_DIR ARCH OUT_DIR
# Writes OUT_DIR/<tag>.log (imagegen's output), the wheel under OUT_DIR/wheels and OUT_DIR/<tag>.check.json.
# Needs: python3 with torch (CUDA) and nvcc; jinja2, pyyaml, packaging (imagegen runs from this tree).
set -uo pipefail
recipe=$1 version=$2 src=$3 arch=$4 out=$5
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$here PYTHONUNBUFFERED=1
tag="$recipe-$version-$(echo "$arch" | tr ';.+' '_-p')"
mkdir -p "$out"
start=$(date +%s)
python3 -m imagegen build "$recipe" --version "$version" --native --src-dir "$src" --arch "$arch" \
  --python-exe python3 --out "$out/wheels-$tag" --work "/tmp/imagegen-$tag" > "$out/$tag.log" 2>&1
rc=$?
echo "build rc=$rc wall=$(( $(date +%s) - start )) s" >> "$out/$tag.log"
[ $rc -eq 0 ] || exit $rc
wheel=$(find "$out/wheels-$tag" -name '*.whl' | head -1)
python3 -m imagegen check "$wheel" --python python3 --json > "$out/$tag.check.json" 2>> "$out/$tag.log"
echo "check rc=$?" >> "$out/$tag.log"
