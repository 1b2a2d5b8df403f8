# shellcheck shell=bash
# `vmrun submit --recover`: the lines vmrun puts into a copy of the user's own bash batch
# script (after its #! and #SBATCH header; the script's own lines follow unchanged), below
# the variables (VMRUN_RECORD_DIR, VMRUN_MAX_RECOVERIES; VMRUN_LAUNCH and VMRUN_AGENT, the
# launch spec and files of the agent that tells the requeues, as in slurm_job.bash) and
# slurm_recover.bash. What slurm_job.bash does for vmrun's own jobs, around the user's: the
# last attempt's failure said with what it cost (vmrun_recover_start); at the script's exit
# (an EXIT trap) a failure, or a node lost under it, requeues the job without the nodes
# lost, within the limit (vmrun_recover_end); a SIGTERM (a stop, the time limit, a
# preemption, Slurm's own requeue after a node failure) only notes a node lost. A script
# that sets its own EXIT or TERM trap replaces these. Every name is vmrun_'s; the lines
# run without the shebang's -e (restored after them), and say what they do in the job's
# output as `vmrun: ...`.
# shellcheck disable=SC2034,SC2154,SC2317  # slurm_recover.bash's names; the traps' functions
case $- in *e*) vmrun_errexit=1; set +e ;; *) vmrun_errexit= ;; esac
vmrun_attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))
vmrun_rec=$VMRUN_RECORD_DIR
VMRUN_RUN_DIR=  # no metrics of vmrun's template here
vmrun_job=$(scontrol show job "$SLURM_JOB_ID" 2>/dev/null)
VMRUN_JOB_LOG=$(printf '%s\n' "$vmrun_job" | sed -n 's/^ *StdOut=//p')
VMRUN_JOB_ERR=$(printf '%s\n' "$vmrun_job" | sed -n 's/^ *StdErr=//p')
vmrun_mark() { shift; printf 'vmrun: %s\n' "$*"; }
vmrun_ended() {
  printf '%s %s %s\n' "$vmrun_attempt" "$1" "$(date +%s)" >> "$vmrun_rec/exit"
}
vmrun_teller=  # run_agent.py, where the run asked to be told
if [ "${#VMRUN_AGENT[@]}" -gt 0 ] && mkdir -p "$vmrun_rec/.watch"; then
  for (( vmrun_i = 0; vmrun_i < ${#VMRUN_AGENT[@]}; vmrun_i += 2 )); do
    printf '%s\n' "${VMRUN_AGENT[vmrun_i + 1]}" > "$vmrun_rec/.watch/${VMRUN_AGENT[vmrun_i]}"
  done
  vmrun_teller=$vmrun_rec/.watch/run_agent.py
fi
# EVENT EXIT: the record's notify.json, as slurm_job.bash tells; python3 (>= 3.8, the
# agent's) looked for when telling, after the script's own `module load`
vmrun_tell() {
  if [ -z "$vmrun_teller" ]; then return 0; fi
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null; then
    printf 'vmrun: not told (%s): no python3 >= 3.8 here for the agent\n' "${1:-the end}"
    return 0
  fi
  python3 "$vmrun_teller" tell "$1" "$2" <<< "$VMRUN_LAUNCH" 2>&1
}
rm -rf "$vmrun_rec"/notified.*
vmrun_nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
vmrun_requeued=
vmrun_exit() {
  local rc=$?
  trap - EXIT TERM
  set +eu
  set +o pipefail 2>/dev/null
  vmrun_recover_end "$rc"
  vmrun_ended "$vmrun_rc"
  exit "$vmrun_rc"
}
vmrun_term() {
  trap - EXIT TERM
  set +eu
  set +o pipefail 2>/dev/null
  if [ -z "$vmrun_requeued" ] && vmrun_lost_on_term; then
    vmrun_mark requeue "attempt $vmrun_attempt: a node was lost; Slurm requeues job $SLURM_JOB_ID"
    vmrun_ended recovery
    vmrun_tell requeue ""
  else
    vmrun_ended terminated
  fi
  exit 143
}
trap vmrun_term TERM
vmrun_recover_start
printf '%s\n' "$vmrun_nodes" > "$vmrun_rec/nodes"
printf '%s %s\n' "$vmrun_attempt" "$(date +%s)" >> "$vmrun_rec/starts"
trap vmrun_exit EXIT
if [ -n "$vmrun_errexit" ]; then set -e; fi
