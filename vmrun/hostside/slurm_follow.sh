# slurm_follow.sh RECORD_DIR JOB SKIP POLL: a job's log from byte SKIP on, as it grows, with
# its state changes between the lines (`\035vmrun state STATE|REASON`), until the job has
# left the queue or ended (`\035vmrun end STATE`: the last state seen; empty when the job
# had gone from squeue already); then the exit record (`\035vmrun exits ...`).
d=$1 job=$2 skip=$3 poll=$4
mark() { printf '\035vmrun %s\n' "$*"; }
(
  last=
  while :; do
    s=$(squeue -h -j "$job" --states=all -o '%T|%r' 2>/dev/null | head -n 1)
    if [ "$s" != "$last" ] && [ -n "$s" ]; then mark state "$s"; fi
    case $s in
      ""|COMPLETED*|FAILED*|CANCELLED*|TIMEOUT*|NODE_FAIL*|OUT_OF_MEMORY*|BOOT_FAIL*|DEADLINE*|PREEMPTED*)
        mark end "${s%%|*}"
        exit 0 ;;
    esac
    last=$s
    sleep "$poll"
  done
) &
w=$!
tail -c "+$((skip + 1))" -F -s 0.5 --pid="$w" "$d/job.log" 2>/dev/null
wait "$w"
mark exits "$(tr '\n' ' ' < "$d/exit" 2>/dev/null)"
