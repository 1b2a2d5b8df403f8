# shellcheck shell=bash
# `train -C NAME --recover`: a failed attempt brings the job back by itself, the same job
# (its id, record and log), never again on a node that was lost, within
# VMRUN_MAX_RECOVERIES. Put into the batch script before slurm_job.bash (or, for `submit
# --recover`, slurm_own_recover.bash), which set vmrun_rec (the record), vmrun_attempt,
# vmrun_nodes (one a line) and define vmrun_mark, vmrun_ended and vmrun_tell, then call
# vmrun_recover_start as an attempt starts, vmrun_recover_end when its step ended, and
# vmrun_lost_on_term from their TERM trap. Every name is vmrun_'s: a user's script may
# define its own `nodes` or `mark`.
# - A failed step whose nodes all answer (a crash): the job is requeued on any nodes.
# - A node that srun said failed, that Slurm holds down, failing, drained or not
#   responding, or (the step failed) that an srun on every node no longer reaches within
#   30 s: requeued without it (`scontrol requeuehold`, ExcNodeList, `release`: ExcNodeList
#   can change only while the job is pending), or, where Slurm requeued the job itself
#   (NODE_FAIL), only kept off it.
# - The batch host lost (nothing of its attempt lives to say so): Slurm requeues the job
#   itself (NODE_FAIL, --requeue); the next attempt finds a start but no end of the last
#   one, names the nodes Slurm holds down (else that batch host) and, if it was placed on
#   one of them again, requeues itself without them.
# - Past VMRUN_MAX_RECOVERIES, or a requeue that does not take: the job ends, said once
#   (a job held and not released is cancelled: nothing waits for ever).
# Files in the record: `lost` (one node a line, never used again by this job),
# `recovering` (the failure's TIME SAVED REACHED ATTEMPT WHY, until an attempt goes on) and
# `recoveries` (KIND<TAB>TIME<TAB>TEXT<TAB>FACTS, as run_note.sh writes them on hosts:
# `status` counts them, `report` reads downtime and epochs redone). The attempt's end in
# `exit` is `recovery` for these requeues (`requeue` is the time limit's, which
# --max-requeues counts).
# shellcheck disable=SC2154,SC2034  # vmrun_rec, vmrun_attempt, vmrun_nodes: set before the
# calls; vmrun_requeued, vmrun_rc: read after them

vmrun_logs() {  # the job's output files (stdout, and stderr where it is another)
  printf '%s\n' "${VMRUN_JOB_LOG:-$vmrun_rec/job.log}"
  if [ -n "${VMRUN_JOB_ERR:-}" ] && [ "$VMRUN_JOB_ERR" != "${VMRUN_JOB_LOG:-}" ]; then
    printf '%s\n' "$VMRUN_JOB_ERR"
  fi
}

vmrun_size() { stat -c %s "$1" 2>/dev/null || echo 0; }

# NODE... -> those of them that Slurm holds down, failing, drained or not responding (*)
vmrun_held_down() {
  [ "$#" -gt 0 ] || return 0
  sinfo -h -N -n "$(printf '%s\n' "$@" | paste -sd, -)" -o '%N %t' 2>/dev/null |
    awk '$2 ~ /down|drain|drng|fail|\*$/ { print $1 }' | sort -u
}

# the nodes srun said failed during this attempt ("srun: error: Node failure on NODE": srun
# may still exit 0, and a node whose slurmd lives returns to service within seconds): the
# output written since the attempt began (vmrun_log_from, vmrun_err_from)
vmrun_failed_in_log() {
  local file from
  while IFS= read -r file; do
    from=$vmrun_log_from
    [ "$file" = "${VMRUN_JOB_LOG:-$vmrun_rec/job.log}" ] || from=$vmrun_err_from
    tail -c "+$(( ${from:-0} + 1 ))" "$file" 2>/dev/null
  done <<EOF | sed -n 's/.*srun: error: Node failure on \([^ ]*\).*/\1/p' | sort -u
$(vmrun_logs)
EOF
}

# NODE... -> those of them srun said failed or Slurm holds down
vmrun_lost_now() {
  { vmrun_held_down "$@"; vmrun_failed_in_log; } | sort -u
}

# NODE... -> those an srun on every node does not reach within 30 s
vmrun_unreached() {
  local answered node
  # shellcheck disable=SC2016  # the node's own name, expanded there
  answered=$(timeout 30 srun --nodes="$#" --ntasks="$#" --ntasks-per-node=1 \
    --kill-on-bad-exit=0 sh -c 'echo "$SLURMD_NODENAME"' 2>/dev/null)
  for node in "$@"; do
    printf '%s\n' "$answered" | grep -qxF "$node" || printf '%s\n' "$node"
  done
}

# the newest snapshot's epoch and the newest finished epoch (the template's log and metrics)
vmrun_saved_epoch() {
  tail -c 262144 "${VMRUN_JOB_LOG:-$vmrun_rec/job.log}" 2>/dev/null |
    grep -aiE 'snapshot.*saved|saved.*snapshot' | tail -n 1 | grep -oE 'epoch[ :=]+[0-9]+' |
    grep -oE '[0-9]+$'
}
vmrun_reached_epoch() {
  [ -n "${VMRUN_RUN_DIR:-}" ] || return 0
  tail -n 1 "$VMRUN_RUN_DIR/metrics.jsonl" 2>/dev/null |
    sed -n 's/.*"epoch": *\([0-9][0-9]*\).*/\1/p'
}

vmrun_spaced() { printf '%s\n' "$1" | paste -sd' ' -; }  # lines -> words

vmrun_recoveries_so_far() {
  local n
  n=$(grep -c '^recovery' "$vmrun_rec/recoveries" 2>/dev/null)
  echo "${n:-0}"
}

# KIND TEXT FACTS: a line in `recoveries` (vmrun_recovery_note: in the run's log too)
vmrun_recorded() {
  printf '%s\t%s\t%s\t%s\n' "$1" "$(date +%s)" "$2" "$3" >> "$vmrun_rec/recoveries"
}
vmrun_recovery_note() {
  printf 'vmrun: %s\n' "$2"
  vmrun_recorded "$@"
}

# WHY [TIME [ATTEMPT]]: what the attempt where the run goes on needs to say what this
# failure cost (this attempt's, unless ATTEMPT)
vmrun_failing() {
  local saved reached
  saved=$(vmrun_saved_epoch) reached=$(vmrun_reached_epoch)
  printf '%s %s %s %s %s\n' "${2:-$(date +%s)}" "${saved:--}" "${reached:--}" \
    "${3:-$vmrun_attempt}" "$1" > "$vmrun_rec/recovering"
}

vmrun_remember_lost() {
  [ "$#" -gt 0 ] || return 0
  printf '%s\n' "$@" >> "$vmrun_rec/lost"
  sort -u -o "$vmrun_rec/lost" "$vmrun_rec/lost"
}

# ExcNodeList: the job's own (its --exclude) and every node in `lost` (Slurm takes a
# change only while the job is pending); fails when Slurm refuses it
vmrun_exclude_lost() {
  local old all
  old=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
    sed -n 's/.*ExcNodeList=\([^ ]*\).*/\1/p' | grep -v '^(null)$')
  all=$({ [ -n "$old" ] && scontrol show hostnames "$old"; cat "$vmrun_rec/lost"; } |
    sort -u | paste -sd, -)
  if ! scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$all"; then
    echo "vmrun: Slurm would not keep job $SLURM_JOB_ID off $all"
    return 1
  fi
}

# Slurm counts the job's requeues: more than when this attempt began means it is back in
# the queue (by vmrun, or by Slurm itself after a node failure)
vmrun_requeued_already() {
  local n
  n=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
  [ "${n:-0}" -gt "${SLURM_RESTART_COUNT:-0}" ]
}

vmrun_held() {  # the job waits, held by its user (requeuehold), not released
  scontrol show job "$SLURM_JOB_ID" 2>/dev/null | grep -q 'Reason=JobHeldUser'
}

# this job back in the queue, never on the nodes in `lost` (succeeds once it is); its own
# SIGTERM (the requeue's) is ignored until the steps are done (no `timeout` around them: it
# would pass that SIGTERM on). A job held and never released, or one that may land on a
# lost node again, is cancelled: nothing is left waiting for ever.
vmrun_requeue_without() {
  (
    trap '' TERM
    held=
    if scontrol requeuehold "$SLURM_JOB_ID" 2>/dev/null; then held=1; fi
    kept=0
    if [ -s "$vmrun_rec/lost" ]; then vmrun_exclude_lost || kept=1; fi
    if [ -n "$held" ]; then
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        scontrol release "$SLURM_JOB_ID" 2>/dev/null
        vmrun_held || break
        sleep 2
      done
    fi
    if [ "$kept" = 1 ] || { [ -n "$held" ] && vmrun_held; }; then
      echo "vmrun: cancelling job $SLURM_JOB_ID: it could not be requeued safely"
      scancel "$SLURM_JOB_ID"
      exit 1
    fi
  ) && vmrun_requeued_already
}

# TEXT: the end of the run's recoveries (the job then ends as it is)
vmrun_give_up() {
  vmrun_recorded gave-up "gave up: $1" '{}'
  vmrun_mark failed "$1"
}

# the last attempt's failure said with what it cost; the limit kept; never on a lost node
vmrun_recover_start() {
  local prev last time saved reached failed why gone placed count facts down
  vmrun_log_from=$(vmrun_size "${VMRUN_JOB_LOG:-$vmrun_rec/job.log}")
  vmrun_err_from=$(vmrun_size "${VMRUN_JOB_ERR:-/dev/null}")
  [ "$vmrun_attempt" -gt 1 ] || return 0
  prev=$((vmrun_attempt - 1))
  last=$(awk -v a="$prev" '$1 == a { w = $2 } END { print w }' "$vmrun_rec/exit" 2>/dev/null)
  if tail -n 1 "$vmrun_rec/recoveries" 2>/dev/null | grep -q '^gave-up'; then
    # given up as Slurm requeued the job (a node failure at the limit): that was the end
    case $last in '' | *[!0-9]*) last=75 ;; esac
    vmrun_mark failed "the run gave up before Slurm requeued it; ending"
    vmrun_ended "$last"
    exit "$last"
  fi
  if [ -z "$last" ] && grep -q "^$prev " "$vmrun_rec/starts" 2>/dev/null; then
    # it began and nothing recorded its end: its batch host went with it (Slurm requeued
    # the job, NODE_FAIL)
    # shellcheck disable=SC2046  # one word per node
    gone=$(vmrun_held_down $(cat "$vmrun_rec/nodes" 2>/dev/null))
    [ -n "$gone" ] || gone=$(head -n 1 "$vmrun_rec/nodes" 2>/dev/null)
    # shellcheck disable=SC2086  # one word per node
    vmrun_remember_lost $gone
    vmrun_failing "node(s) $(vmrun_spaced "$gone") lost" \
      "$(stat -c %Y "${VMRUN_JOB_LOG:-$vmrun_rec/job.log}" 2>/dev/null)" "$prev"
    vmrun_tell requeue ""  # the other failures were told as they happened
  fi
  # placed on a lost node again (it came back): away first; the recovery is said by the
  # attempt where the run goes on, with the whole downtime
  placed=
  if [ -s "$vmrun_rec/lost" ]; then
    placed=$(printf '%s\n' "$vmrun_nodes" | grep -xF -f "$vmrun_rec/lost")
  fi
  if [ -n "$placed" ]; then
    echo "vmrun: attempt $vmrun_attempt was placed on $(vmrun_spaced "$placed"), lost before: requeued without it"
    vmrun_requeued=1
    vmrun_ended recovery
    if vmrun_requeue_without; then exit 0; fi
    vmrun_give_up "job $SLURM_JOB_ID could not be requeued without $(vmrun_spaced "$placed")"
    vmrun_ended 75
    exit 75
  fi
  if [ -s "$vmrun_rec/recovering" ]; then
    read -r time saved reached failed why < "$vmrun_rec/recovering"
    rm -f "$vmrun_rec/recovering"
    count=$(( $(vmrun_recoveries_so_far) + 1 ))
    if [ "$count" -gt "$VMRUN_MAX_RECOVERIES" ]; then
      vmrun_give_up "attempt $failed failed ($why); --max-recoveries $VMRUN_MAX_RECOVERIES spent"
      vmrun_ended 75
      vmrun_tell "" 75
      exit 75
    fi
    case $time in '' | *[!0-9]*) time=$(date +%s) ;; esac
    down=$(( $(date +%s) - time ))
    facts="{\"downtime_s\": $down"
    case $saved$reached in
      *[!0-9]* | "") ;;
      *) saved=$((10#$saved)) reached=$((10#$reached))
        facts="$facts, \"epochs_redone\": $(( reached > saved ? reached - saved : 0 ))" ;;
    esac
    if [ -s "$vmrun_rec/lost" ]; then
      facts="$facts, \"lost\": [$(sed 's/.*/"&"/' "$vmrun_rec/lost" | paste -sd, -)]"
    fi
    vmrun_recovery_note recovery "attempt $failed failed ($why); attempt $vmrun_attempt on $(vmrun_spaced "$vmrun_nodes") ($down s down, recovery $count of $VMRUN_MAX_RECOVERIES)" "$facts}"
  fi
}

# RC: the step ended: a failure (or a node lost under it, whatever srun's code) requeues
# the job, without the nodes lost; past the limit, or a requeue that does not take, the end
# is said. Returns only when the attempt's end is the run's; vmrun_rc is then its code.
vmrun_recover_end() {
  local lost count why
  vmrun_rc=$1
  # shellcheck disable=SC2086  # one word per node
  lost=$(vmrun_lost_now $vmrun_nodes)
  if [ -z "$lost" ]; then
    [ "$1" != 0 ] || return 0  # it ended well, on nodes that are well
    # shellcheck disable=SC2086
    lost=$(vmrun_unreached $vmrun_nodes)
  fi
  why="exit $1"
  [ -z "$lost" ] || why="node(s) $(vmrun_spaced "$lost") lost"
  count=$(vmrun_recoveries_so_far)
  if [ "$count" -ge "$VMRUN_MAX_RECOVERIES" ]; then
    vmrun_give_up "attempt $vmrun_attempt failed ($why); --max-recoveries $VMRUN_MAX_RECOVERIES spent"
    [ "$1" != 0 ] || vmrun_rc=75  # a step cut short by a lost node failed
    return
  fi
  # shellcheck disable=SC2086
  vmrun_remember_lost $lost
  vmrun_failing "$why"
  vmrun_ended recovery
  vmrun_mark requeue "attempt $vmrun_attempt failed ($why); requeueing job $SLURM_JOB_ID${lost:+ without $(vmrun_spaced "$lost")}"
  vmrun_tell requeue ""
  vmrun_requeued=1
  if vmrun_requeue_without; then exit 0; fi  # the next attempt says what it cost
  rm -f "$vmrun_rec/recovering"
  vmrun_give_up "job $SLURM_JOB_ID could not be requeued"
  [ "$1" != 0 ] || vmrun_rc=75
}

# Slurm ends the attempt (SIGTERM) and has requeued the job itself for a node it holds
# down or that srun said failed (NODE_FAIL, --requeue): that node is remembered and kept
# off the next attempts while the job waits. A stop, a time limit or a preemption is none
# of this (fails).
vmrun_lost_on_term() {
  local lost
  # shellcheck disable=SC2086  # one word per node
  lost=$(vmrun_lost_now $vmrun_nodes)
  if [ -z "$lost" ] || ! vmrun_requeued_already; then return 1; fi
  # shellcheck disable=SC2086
  vmrun_remember_lost $lost
  vmrun_failing "node(s) $(vmrun_spaced "$lost") lost"
  (trap '' TERM; vmrun_exclude_lost 2>/dev/null)
  vmrun_requeued=1
  return 0
}
