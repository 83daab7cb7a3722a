#!/usr/bin/env bash
# A rank that hangs or dies in data-parallel training ends the job, never hangs it
# (docs/distributed.md, "Faults"): usage fault_jobs.sh MPIEXEC FAULT_JOB.
#  - hang, 4 ranks: rank 1 stops answering; ranks 0, 2 and 3 each fail with a
#    loom::distributed_error within the timeout (LOOM_DISTRIBUTED_TIMEOUT=2 s).
#  - die, 2 ranks: rank 1 exits mid-step; the job ends (mpirun ends the other ranks).
set -u
mpiexec=$1
job=$2
failed=0
run() {  # run NP FAULT: the job's output in $out, its status in $status, its seconds in $took
  local start=$SECONDS
  out=$(LOOM_DISTRIBUTED_TIMEOUT=2 timeout 120 "$mpiexec" -np "$1" --oversubscribe "$job" "$2" 2>&1)
  status=$?
  took=$((SECONDS - start))
  echo "--- $2 on $1 ranks: exit status $status after ${took} s"
  echo "$out"
}
check() {  # check CONDITION MESSAGE
  if ! eval "$1"; then
    echo "FAILED: $2"
    failed=1
  fi
}

run 4 hang
check '[ "$status" -ne 124 ]' "the job with a hung rank did not end within 120 s"
for r in 0 2 3; do
  check 'grep -q "^rank $r: distributed_error: .*timed out after 2000 ms" <<<"$out"' \
    "rank $r did not fail with a distributed_error naming the timeout"
done
check '! grep -q ": trained" <<<"$out"' "a rank finished training without rank 1"

run 2 die
check '[ "$status" -ne 124 ]' "the job with a dead rank did not end within 120 s"
check '[ "$status" -ne 0 ]' "the job with a dead rank exited 0"
check '! grep -q ": trained" <<<"$out"' "a rank finished training without rank 1"

exit $failed
