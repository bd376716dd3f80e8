#!/usr/bin/env bash
# GPU proofs longer than one device call (a Block-Sparse-Attention pair is ~21 min; a call may run
# 10 min, and the machine is given back 30 s after a call ends): `start` launches proof_all.sh in a
# session of its own, which outlives the call, and then waits like `wait`; `wait` blocks until the
# proofs are done or its time is up. Issue one call after the other, each with `wait`, until it
# exits 0; it then copies the results (without the wheels) to OUT/proofs.tgz and prints them.
#   PROOFS="block-sparse-attn:imagegen-first" scripts/gpu/proof_bg.sh start SAGE_SRC BSA_SRC OUT [SECONDS]
#   scripts/gpu/proof_bg.sh wait OUT [SECONDS]
# SECONDS: how long this call may wait (default 560, for a 600 s call). Exit 0: done, 1: the proofs
# died, 2: still running (call `wait` again), 3: nothing started here (a replaced machine: `start` again).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=/tmp/imagegen-proofs
cmd=${1:-}
shift || true

wait_for_proofs() {  # $1: OUT, $2: seconds
  local out=$1 budget=$2
  if [ ! -f "$results/run.log" ]; then
    echo "no proof has been started on this machine (a fresh machine has nothing): run 'start' again"
    exit 3
  fi
  while ! grep -q '^all done' "$results/run.log" && (( SECONDS < budget )); do
    if ! pgrep -f "$here/proof_all.sh" > /dev/null && ! grep -q '^all done' "$results/run.log"; then
      tail -n 20 "$results/run.log" | cut -c1-300
      echo "the proofs stopped without finishing (see above)"
      exit 1
    fi
    sleep 10
  done
  tail -n 20 "$results/run.log" | cut -c1-300
  if ! grep -q '^all done' "$results/run.log"; then
    echo "still running after ${SECONDS} s: call 'wait' again"
    exit 2
  fi
  mkdir -p "$out"
  tar -czf "$out/proofs.tgz" --exclude=wheels -C "$results" .
  for f in "$results"/*/result.json; do [ -f "$f" ] && cat "$f"; done
  exit 0
}

case $cmd in
  start)
    [ $# -ge 3 ] || { echo "usage: $0 start SAGE_SRC BSA_SRC OUT [SECONDS]"; exit 64; }
    rm -rf "$results" && mkdir -p "$results"
    # Sources are copied by proof_all.sh before it times anything: later calls need not carry them.
    setsid nohup bash "$here/proof_all.sh" "$1" "$2" "$results" > "$results/launcher.log" 2>&1 < /dev/null &
    sleep 2
    wait_for_proofs "$3" "${4:-560}"
    ;;
  wait)
    [ $# -ge 1 ] || { echo "usage: $0 wait OUT [SECONDS]"; exit 64; }
    wait_for_proofs "$1" "${2:-560}"
    ;;
  *)
    echo "usage: $0 start SAGE_SRC BSA_SRC OUT [SECONDS] | wait OUT [SECONDS]"
    exit 64
    ;;
esac
