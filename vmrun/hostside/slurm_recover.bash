# shellcheck shell=bash
# shellcheck disable=SC2154  # rec, attempt, nodes, requeued: slurm_job.bash's
# `train -C NAME --recover`: a failed attempt brings the job back by itself, the same job
# (its id, record and log), never again on a node that was lost, within
# VMRUN_MAX_RECOVERIES. Put into the batch script before slurm_job.bash, which calls
# recover_start as an attempt starts, recover_end when its step failed, and lost_on_term
# from its TERM trap.
# - A failed step whose nodes all answer (a crash): the job is requeued on any nodes.
# - A node that srun said failed, that Slurm holds down, failing, drained or not
#   responding, or (the step failed) that an `srun` of `true` on every node no longer
#   reaches: requeued without it (`scontrol requeuehold`, ExcNodeList, `release`:
#   ExcNodeList can change only while the job is pending), or, where Slurm requeued the job
#   itself (NODE_FAIL), only kept off it.
# - The batch host lost (nothing of its attempt lives to say so): Slurm requeues the job
#   itself (NODE_FAIL, --requeue); the next attempt finds no end of the last one, names the
#   nodes Slurm holds down (else that batch host) and, if it was placed on one of them
#   again, requeues itself without them.
# - Past VMRUN_MAX_RECOVERIES, or a requeue that does not take: the job ends, said once.
# Files in $rec: `lost` (one node a line, never used again by this job), `recovering` (the
# failure's TIME SAVED REACHED WHY, until the next attempt starts) and `recoveries`
# (KIND<TAB>TIME<TAB>TEXT<TAB>FACTS, as run_note.sh writes them on hosts: `status` counts
# them, `report` reads downtime and epochs redone).

# NODE... -> those of them that Slurm holds down, failing, drained or not responding (*)
held_down() {
  [ "$#" -gt 0 ] || return 0
  sinfo -h -N -n "$(printf '%s\n' "$@" | paste -sd, -)" -o '%N %t' 2>/dev/null |
    awk '$2 ~ /down|drain|drng|fail|\*$/ { print $1 }' | sort -u
}

# the nodes srun said failed during this attempt ("srun: error: Node failure on NODE": srun
# may still exit 0, and a node whose slurmd lives returns to service within seconds); the
# attempt's lines are those after log_from (recover_start's)
failed_in_log() {
  tail -c "+$(( ${log_from:-0} + 1 ))" "${VMRUN_JOB_LOG:-$rec/job.log}" 2>/dev/null |
    sed -n 's/.*srun: error: Node failure on \([^ ]*\).*/\1/p' | sort -u
}

# NODE... -> those of them srun said failed or Slurm holds down
lost_now() {
  { held_down "$@"; failed_in_log; } | sort -u
}

# NODE... -> those an srun of `true` on every node does not reach within 30 s
unreached() {
  local answered node
  # shellcheck disable=SC2016  # the node's own name, expanded there
  answered=$(timeout 30 srun --nodes="$#" --ntasks="$#" --ntasks-per-node=1 \
    --kill-on-bad-exit=0 sh -c 'echo "$SLURMD_NODENAME"' 2>/dev/null)
  for node in "$@"; do
    printf '%s\n' "$answered" | grep -qxF "$node" || printf '%s\n' "$node"
  done
}

# the newest snapshot's epoch and the newest finished epoch (the template's log and metrics)
saved_epoch() {
  tail -c 262144 "${VMRUN_JOB_LOG:-$rec/job.log}" 2>/dev/null | grep -aiE 'snapshot.*saved|saved.*snapshot' |
    tail -n 1 | grep -oE 'epoch[ :=]+[0-9]+' | grep -oE '[0-9]+$'
}
reached_epoch() {
  tail -n 1 "$VMRUN_RUN_DIR/metrics.jsonl" 2>/dev/null |
    sed -n 's/.*"epoch": *\([0-9][0-9]*\).*/\1/p'
}

spaced() { printf '%s\n' "$1" | paste -sd' ' -; }  # lines -> words

recoveries_so_far() { { grep -c '^recovery' < "$rec/recoveries"; } 2>/dev/null || echo 0; }

# KIND TEXT FACTS: a line in `recoveries` (recovery_note: in the run's log too)
recorded() { printf '%s\t%s\t%s\t%s\n' "$1" "$(date +%s)" "$2" "$3" >> "$rec/recoveries"; }
recovery_note() {
  printf 'vmrun: %s\n' "$2"
  recorded "$@"
}

# WHY [TIME]: what the next attempt needs to say what this failure cost
failing() {
  local saved reached
  saved=$(saved_epoch) reached=$(reached_epoch)
  printf '%s %s %s %s\n' "${2:-$(date +%s)}" "${saved:--}" "${reached:--}" "$1" \
    > "$rec/recovering"
}

remember_lost() {
  [ "$#" -gt 0 ] || return 0
  printf '%s\n' "$@" >> "$rec/lost"
  sort -u -o "$rec/lost" "$rec/lost"
}

# ExcNodeList: the job's own (its --exclude) and every node in $rec/lost (Slurm takes a
# change only while the job is pending)
exclude_lost() {
  local old all
  old=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
    sed -n 's/.*ExcNodeList=\([^ ]*\).*/\1/p' | grep -v '^(null)$')
  all=$({ [ -n "$old" ] && scontrol show hostnames "$old"; cat "$rec/lost"; } |
    sort -u | paste -sd, -)
  scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$all" ||
    echo "vmrun: could not keep job $SLURM_JOB_ID off $all"
}

# Slurm counts the job's requeues: more than when this attempt began means it is back in
# the queue (by vmrun, or by Slurm itself after a node failure)
requeued_already() {
  local n
  n=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
  [ "${n:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]
}

# this job back in the queue, never on the nodes in $rec/lost (succeeds once it is); its
# own SIGTERM (the requeue's) is ignored until the three steps are done (no `timeout` around
# them: it would pass that SIGTERM on, and a job held for ever is worse than a wait)
requeue_without() {
  (
    trap '' TERM
    held=
    if scontrol requeuehold "$SLURM_JOB_ID" 2>/dev/null; then held=1; fi
    if [ -s "$rec/lost" ]; then exclude_lost; fi
    if [ -n "$held" ]; then
      for _ in 1 2 3; do scontrol release "$SLURM_JOB_ID" && break; sleep 1; done
    fi
  )
  requeued_already
}

# TEXT: the end of the run's recoveries (the job then ends as it is)
give_up() {
  recorded gave-up "gave up: $1" '{}'
  mark failed "$1"
}

# the last attempt's failure said with what it cost; the limit kept; never on a lost node
recover_start() {
  local prev last time saved reached why gone placed count facts down
  log_from=$(stat -c %s "${VMRUN_JOB_LOG:-$rec/job.log}" 2>/dev/null || echo 0)
  [ "$attempt" -gt 1 ] || return 0
  prev=$((attempt - 1))
  last=$(awk -v a="$prev" '$1 == a { w = $2 } END { print w }' "$rec/exit" 2>/dev/null)
  if tail -n 1 "$rec/recoveries" 2>/dev/null | grep -q '^gave-up'; then
    # given up as Slurm requeued the job (a node failure at the limit): that was the end
    case $last in '' | *[!0-9]*) last=75 ;; esac
    mark failed "the run gave up before Slurm requeued it; ending"
    ended "$last"
    exit "$last"
  fi
  if [ -z "$last" ]; then  # its batch host went with it: Slurm requeued the job
    # shellcheck disable=SC2046  # one word per node
    gone=$(held_down $(cat "$rec/nodes" 2>/dev/null))
    [ -n "$gone" ] || gone=$(head -n 1 "$rec/nodes" 2>/dev/null)
    # shellcheck disable=SC2086  # one word per node
    remember_lost $gone
    failing "node(s) $(spaced "$gone") lost" "$(stat -c %Y "${VMRUN_JOB_LOG:-$rec/job.log}" 2>/dev/null)"
    tell requeue ""  # the other failures were told as they happened
  fi
  if [ -s "$rec/recovering" ]; then
    read -r time saved reached why < "$rec/recovering"
    rm -f "$rec/recovering"
    count=$(( $(recoveries_so_far) + 1 ))
    if [ "$count" -gt "$VMRUN_MAX_RECOVERIES" ]; then
      give_up "attempt $prev failed ($why); --max-recoveries $VMRUN_MAX_RECOVERIES spent"
      ended 75
      tell "" 75
      exit 75
    fi
    down=$(( $(date +%s) - time ))
    facts="{\"downtime_s\": $down"
    case $saved$reached in
      *[!0-9]* | "") ;;
      *) facts="$facts, \"epochs_redone\": $(( reached > saved ? reached - saved : 0 ))" ;;
    esac
    if [ -s "$rec/lost" ]; then
      facts="$facts, \"lost\": [$(sed 's/.*/"&"/' "$rec/lost" | paste -sd, -)]"
    fi
    recovery_note recovery "attempt $prev failed ($why); attempt $attempt on $(spaced "$nodes") ($down s down, recovery $count of $VMRUN_MAX_RECOVERIES)" "$facts}"
  fi
  [ -s "$rec/lost" ] || return 0
  placed=$(printf '%s\n' "$nodes" | grep -xF -f "$rec/lost")
  [ -n "$placed" ] || return 0
  echo "vmrun: attempt $attempt was placed on $(spaced "$placed"), lost before: requeued without it"
  # shellcheck disable=SC2034  # read by slurm_job.bash's TERM trap
  requeued=1
  ended requeue
  if requeue_without; then exit 0; fi
  give_up "scontrol could not requeue job $SLURM_JOB_ID without $(spaced "$placed")"
  ended 75
  exit 75
}

# RC: the step ended: a failure (or a node lost under it, whatever srun's code) requeues
# the job, without the nodes lost; past the limit, or a requeue that does not take, the end
# is said. Returns only when the attempt's end is the run's.
recover_end() {
  local lost count why
  # shellcheck disable=SC2086  # one word per node
  lost=$(lost_now $nodes)
  if [ -z "$lost" ]; then
    [ "$1" != 0 ] || return 0  # it ended well, on nodes that are well
    # shellcheck disable=SC2086
    lost=$(unreached $nodes)
  fi
  why="exit $1"
  [ -z "$lost" ] || why="node(s) $(spaced "$lost") lost"
  count=$(recoveries_so_far)
  if [ "$count" -ge "$VMRUN_MAX_RECOVERIES" ]; then
    give_up "attempt $attempt failed ($why); --max-recoveries $VMRUN_MAX_RECOVERIES spent"
    # shellcheck disable=SC2034  # slurm_job.bash's: a step cut short by a lost node failed
    [ "$1" != 0 ] || rc=75
    return
  fi
  # shellcheck disable=SC2086
  remember_lost $lost
  failing "$why"
  ended requeue
  mark requeue "attempt $attempt failed ($why); requeueing job $SLURM_JOB_ID${lost:+ without $(spaced "$lost")}"
  tell requeue ""
  # shellcheck disable=SC2034  # read by slurm_job.bash's TERM trap
  requeued=1
  if requeue_without; then exit 0; fi  # the next attempt says what it cost
  rm -f "$rec/recovering"
  give_up "scontrol could not requeue job $SLURM_JOB_ID"
}

# Slurm ends the attempt (SIGTERM): a node it holds down is remembered (Slurm requeues the
# job itself: NODE_FAIL, --requeue) and kept off the next attempts while the job waits
lost_on_term() {
  local lost
  # shellcheck disable=SC2086  # one word per node
  lost=$(lost_now $nodes)
  [ -n "$lost" ] || return 1
  # shellcheck disable=SC2086
  remember_lost $lost
  failing "node(s) $(spaced "$lost") lost"
  (trap '' TERM; exclude_lost 2>/dev/null)
  return 0
}
