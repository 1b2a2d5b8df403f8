# shellcheck shell=bash
# `vmrun submit --recover`: the lines vmrun puts into a copy of the user's own bash batch
# script (after its #! and #SBATCH header; the script's own lines follow unchanged), below
# the variables (VMRUN_RECORD_DIR, VMRUN_MAX_RECOVERIES, VMRUN_NOTIFIER) and
# slurm_recover.bash. What slurm_job.bash does for vmrun's own jobs, around the user's: the
# last attempt's failure said with what it cost (recover_start), and at the script's exit
# (an EXIT trap: a script that sets its own replaces it) a failure, or a node lost under
# it, requeues the job without the nodes lost, within the limit (recover_end). Its lines go
# to the job's output as `vmrun: ...`, among the script's.
# shellcheck disable=SC2034  # attempt, nodes, requeued: slurm_recover.bash's
attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))
rec=$VMRUN_RECORD_DIR
VMRUN_RUN_DIR=  # no metrics of vmrun's template here
VMRUN_JOB_LOG=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null | sed -n 's/^ *StdOut=//p')
mark() { shift; printf 'vmrun: %s\n' "$*"; }
ended() { printf '%s %s %s\n' "$attempt" "$1" "$(date +%s)" >> "$rec/exit"; }
tell() {  # EVENT EXIT: the record's notify.json, as slurm_job.bash tells
  if [ -n "${VMRUN_NOTIFIER:-}" ] && [ -r "$rec/notify.json" ] &&
    command -v python3 >/dev/null 2>&1; then
    python3 -c "$VMRUN_NOTIFIER" "$rec" send "$1" "$2" </dev/null 2>&1
  fi
}
rm -rf "$rec"/notified.*
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
requeued=
recover_start
printf '%s\n' "$nodes" > "$rec/nodes"
printf '%s %s\n' "$attempt" "$(date +%s)" >> "$rec/starts"
vmrun_exit() {
  rc=$?
  trap - EXIT
  set +eu
  set +o pipefail 2>/dev/null
  recover_end "$rc"
  ended "$rc"
  exit "$rc"
}
trap vmrun_exit EXIT
