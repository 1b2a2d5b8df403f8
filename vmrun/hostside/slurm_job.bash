# shellcheck shell=bash
# The body of every batch script vmrun submits (vmrun.backends.slurm.job puts the #SBATCH lines and
# the run's variables above it, so the job holds all it runs: a queued job never changes).
# Variables: VMRUN_RUN_ID, VMRUN_RECORD_DIR (this run's files on the shared filesystem),
# VMRUN_RUN_DIR (the run's output folder), VMRUN_LAUNCHER (torchrun|env|python),
# VMRUN_NPROC (torchrun's processes per node), VMRUN_MAX_RESTARTS, VMRUN_MAX_REQUEUES,
# VMRUN_PYTHON, VMRUN_MODULES (array), VMRUN_TASK (slurm_task.sh's text), VMRUN_COMMAND
# (array: the script and its arguments); with an image (vmrun.containers.runtime
# .slurm_container): VMRUN_SRUN (array: pyxis' srun options), VMRUN_PREFIX (array: the
# words before the task: apptainer's or shifter's, or docker/podman's container_run.sh
# arguments, VMRUN_RUNNER its text), VMRUN_PULL (array: container_pull.sh's arguments,
# VMRUN_PULL_SCRIPT its text), VMRUN_CONTAINER_HOME (the HOME docker/podman's container
# gets). The task script runs inside the image in every case. VMRUN_LAUNCH: the launch spec
# (vmrun.runs.launch_spec, JSON, no secret) that the job's agent reads on its stdin;
# VMRUN_AGENT (array: NAME TEXT ...): run_agent.py and the parts it runs here, written into
# $rec/.watch (empty: the agent has nothing to do). The agent tells the run's end and
# requeues to the webhooks of the record's notify.json (once per event: the follower claims
# them too), gives a torchrun run's failed worker's own exit code for the job's (torchrun's
# summary in the log; failure.json: which rank, where), and watches the step for hangs.
# VMRUN_MAX_RECOVERIES: --recover's limit (0: none; slurm_recover.bash then comes first).
# The spec's hang watcher (--hang-timeout) watches the step from here (the ranks' heartbeats
# in $rec/beat, their lines in job.log). Its budget (--max-cost, budget_watch.py): from the
# first attempt's start (queue waits between attempts count, as the run's cost does), the
# agent writes $rec/budget and sends this shell SIGUSR2 as at its time limit, the ranks
# save their epoch, and the job ends stopped (never requeued): an `exit` line `budget`,
# $rec/stopped; spent before an attempt, the attempt starts nothing; on a node without a
# python3 >= 3.8 (after `module load`), a capped attempt starts nothing either (failed, 3).
# Lines that start with \035vmrun are for vmrun's reader; everything else is the run's log.
set -u
attempt=$(( ${SLURM_RESTART_COUNT:-0} + 1 ))
rec=$VMRUN_RECORD_DIR
mark() { printf '\035vmrun %s\n' "$*"; }
ended() { printf '%s %s %s\n' "$attempt" "$1" "$(date +%s)" >> "$rec/exit"; }
agent=  # the job's agent, where it has something to do and python3 is here
find_agent() {  # again after `module load`, which may be what puts python3 on the PATH
  if [ "${#VMRUN_AGENT[@]}" -gt 0 ] && command -v python3 >/dev/null 2>&1 &&
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null &&
    mkdir -p "$rec/.watch"; then
    for (( i = 0; i < ${#VMRUN_AGENT[@]}; i += 2 )); do
      printf '%s\n' "${VMRUN_AGENT[i + 1]}" > "$rec/.watch/${VMRUN_AGENT[i]}"
    done
    agent=$rec/.watch/run_agent.py
  fi
}
find_agent
# shellcheck disable=SC2153  # VMRUN_LAUNCH: the header's
tell() {  # EVENT EXIT: "" lets the sender tell an end from the exit code and the record
  if [ -n "$agent" ]; then python3 "$agent" tell "$1" "$2" <<< "$VMRUN_LAUNCH" 2>&1; fi
}
rm -rf "$rec"/notified.*  # each attempt's end is told afresh
rm -f "$rec"/provenance-*.json  # each attempt's nodes describe themselves (a requeue moves it)
rm -f "$rec/failure.json" "$rec/hang" "$rec/hang_stopped" "$rec/budget"
rm -rf "$rec/beat"
nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST")
# Slurm ends the attempt: a requeue (vmrun's own ends the attempt so, and is told already),
# a node lost (--recover: Slurm requeues the job, kept off that node), or a stop
# shellcheck disable=SC2317  # called by the trap
terminated() {
  if [ -z "${vmrun_requeued:-}" ] && [ "${VMRUN_MAX_RECOVERIES:-0}" -gt 0 ] &&
    vmrun_lost_on_term; then
    mark requeue "attempt $attempt: a node was lost; Slurm requeues job $SLURM_JOB_ID"
    ended recovery
    tell requeue ""
    exit 143
  fi
  mark terminated "attempt $attempt"
  ended terminated
  if [ -z "${vmrun_requeued:-}" ]; then tell "" terminated; fi
  exit 143
}
# --recover (slurm_recover.bash, above this when asked): the last attempt's failure said,
# the limit kept, never on a node that was lost
if [ "${VMRUN_MAX_RECOVERIES:-0}" -gt 0 ]; then
  # shellcheck disable=SC2034  # slurm_recover.bash's
  vmrun_rec=$rec vmrun_attempt=$attempt vmrun_nodes=$nodes
  # shellcheck disable=SC2317  # called by slurm_recover.bash
  vmrun_mark() { mark "$@"; }
  # shellcheck disable=SC2317
  vmrun_ended() { ended "$@"; }
  # shellcheck disable=SC2317
  vmrun_tell() { tell "$@"; }
fi
trap terminated TERM
if [ "${VMRUN_MAX_RECOVERIES:-0}" -gt 0 ]; then vmrun_recover_start; fi
printf '%s\n' "$nodes" > "$rec/nodes"
printf '%s %s\n' "$attempt" "$(date +%s)" >> "$rec/starts"
MASTER_ADDR=$(printf '%s\n' "$nodes" | head -n 1)
# one port per job: two jobs sharing a node never collide (ids differ by less than 20000)
MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
export MASTER_ADDR MASTER_PORT
# shellcheck disable=SC2086  # one word per node
mark attempt "$attempt" job "$SLURM_JOB_ID" start "$(date +%s)" nodes $nodes
# srun in Slurm >= 22.05 no longer takes --cpus-per-task from the allocation
if [ -n "${SLURM_CPUS_PER_TASK:-}" ]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi
# the run's own variables (--env, the cluster's env): a 0600 file, never a command
# line; first, so that they can steer `module load` (MODULEPATH)
if [ -r "$rec/env" ]; then
  # shellcheck disable=SC1091
  . "$rec/env"
fi
if [ "${#VMRUN_MODULES[@]}" -gt 0 ]; then
  if ! command -v module >/dev/null 2>&1; then  # a batch shell is not a login shell
    for init in /etc/profile.d/lmod.sh /etc/profile.d/modules.sh \
      /usr/share/lmod/lmod/init/bash /usr/share/modules/init/bash \
      /usr/share/Modules/init/bash; do
      # shellcheck disable=SC1090
      if [ -r "$init" ]; then . "$init"; break; fi
    done
  fi
  if ! module load "${VMRUN_MODULES[@]}"; then
    mark failed "module load ${VMRUN_MODULES[*]} failed"
    ended 3
    tell "" 3
    exit 3
  fi
fi
if [ -z "$agent" ]; then find_agent; fi
capped=  # --max-cost asked: its watcher is among the agent's files
for (( i = 0; i < ${#VMRUN_AGENT[@]}; i += 2 )); do
  if [ "${VMRUN_AGENT[i]}" = budget_watch.py ]; then capped=1; fi
done
budget_cap=  # --max-cost as the user wrote it (the agent's: "" none)
if [ -n "$agent" ] && budget_cap=$(python3 "$agent" budget <<< "$VMRUN_LAUNCH" 2>/dev/null); then
  :
elif [ -n "$capped" ]; then  # a cap no one would keep: never a run spending past it unwatched
  mark failed "--max-cost is kept by the job's agent, which needs python3 >= 3.8 on the node: $(hostname) has none that runs it; nothing was started"
  ended 3
  tell "" 3
  exit 3
fi
if [ -e "$rec/budget" ]; then  # the agent found the cap spent already
  mark budget "the run had cost --max-cost $budget_cap before attempt $attempt: stopped"
  date +%s > "$rec/stopped"
  ended budget
  tell stopped ""
  exit 0
fi
# torch's flight recorder, dumped into the record when an NCCL collective times out (as on
# hosts): VMRUN_FLIGHT_RECORDER's NAME=VALUE words, named for the job's torch
# (vmrun.runs.launch.flight_recorder_env), unless the run's own variables say otherwise
mkdir -p "$rec/nccl"
for setting in ${VMRUN_FLIGHT_RECORDER[@]+"${VMRUN_FLIGHT_RECORDER[@]}"}; do
  name=${setting%%=*}
  [ -n "${!name+set}" ] || export "${setting?}"
done
export PYTHONUNBUFFERED=1 VMRUN_RUN_ID VMRUN_RUN_DIR VMRUN_LAUNCHER VMRUN_NPROC
export VMRUN_MAX_RESTARTS VMRUN_PYTHON VMRUN_RECORD_DIR
export VMRUN_REQUEUE_FILE="$rec/requeue" VMRUN_WARNED_FILE="$rec/warned"
export VMRUN_BEAT_DIR="$rec/beat"
rm -f "$VMRUN_REQUEUE_FILE" "$VMRUN_WARNED_FILE"
mkdir -p "$VMRUN_RUN_DIR"
# The time-limit warning (--signal=B:USR2@N) comes here: leave a mark that a process still
# starting up finds at its first epoch's end, and pass the signal on to every step.
# shellcheck disable=SC2317  # called by the trap
warned() {
  : > "$VMRUN_WARNED_FILE"
  if [ -e "$rec/budget" ]; then
    mark warned "the run has cost --max-cost ${budget_cap:-?} (SIGUSR2): it saves and stops"
  else
    mark warned "the time limit is near (SIGUSR2): the run saves and is requeued"
  fi
  scancel --signal=USR2 "$SLURM_JOB_ID" 2>/dev/null
}
trap warned USR2
step=(sh -c "$VMRUN_TASK" vmrun-task "${VMRUN_COMMAND[@]}")
if [ -n "$VMRUN_RUNNER" ]; then
  # docker/podman: the daemon's containers are not the step's processes, so Slurm's SIGKILL
  # (KillWait after its SIGTERM) would leave them running: the runner's `stop` waits less
  kill_wait=$(scontrol show config 2>/dev/null | sed -n 's/^KillWait *= *\([0-9]*\).*/\1/p')
  VMRUN_GRACE=$(( ${kill_wait:-30} > 3 ? ${kill_wait:-30} - 2 : 1 ))
  export VMRUN_GRACE
  # the HOME inside (caches of torch, pip): made here, or the daemon would make it as root
  if [ -n "$VMRUN_CONTAINER_HOME" ]; then mkdir -p "$VMRUN_CONTAINER_HOME"; fi
  # the image on every node before the step, as the run's pull policy says (VMRUN_PULL[2]):
  # a missing image or a refusing registry is one line here, and every node must run the
  # same image (its ID, as container_pull.sh says it last), else nothing starts
  if [ "${#VMRUN_PULL[@]}" -gt 0 ]; then
    if ! pulled=$(srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \
      --kill-on-bad-exit=1 --label sh -c "$VMRUN_PULL_SCRIPT" vmrun-container-pull \
      "${VMRUN_PULL[@]}" 2>&1); then
      rc=14
      printf '%s\n' "$pulled" | grep -v "$(printf '\035')vmrun" | tail -n 5
      mark failed "the pull of ${VMRUN_PULL[1]} (pull = ${VMRUN_PULL[2]}) failed on a node"
      ended "$rc"
      exit "$rc"
    fi
    printf '%s\n' "$pulled" | sed -n "s/^ *\([0-9]*\): $(printf '\035')vmrun kept /node \1 kept its own image: /p"
    ids=$(printf '%s\n' "$pulled" | sed -n "s/^ *\([0-9]*\): $(printf '\035')vmrun image //p" | sort -u)
    if [ "$(printf '%s\n' "$ids" | grep -c .)" -gt 1 ]; then
      rc=14
      byn=$(printf '%s\n' "$pulled" | sed -n "s/^ *\([0-9]*\): $(printf '\035')vmrun image sha256:\(.\{12\}\).*/\1:\2/p" \
        | while IFS=: read -r i id; do printf '%s %s; ' "$(printf '%s\n' "$nodes" | sed -n "$((i + 1))p")" "$id"; done)
      mark failed "the nodes would run different images of ${VMRUN_PULL[1]} (${byn%; }); nothing was started"
      ended "$rc"
      exit "$rc"
    fi
  fi
  # each task's container: the run's name and the task's number (env: one task per rank),
  # and Slurm's variables passed by name, as the task script reads them inside
  # shellcheck disable=SC2016  # expanded by the task's own shell, on its node
  in_engine='r=$1 d=$2 n=$3-$SLURM_PROCID g=${VMRUN_GRACE:-$4}; shift 4
for v in $(env | sed -n "s/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p"); do set -- -e "$v" "$@"; done
exec sh -c "$r" vmrun-container "$d" "$n" "$g" --label "vmrun.node=$SLURM_PROCID" "$@"'
  step=(sh -c "$in_engine" vmrun-step "$VMRUN_RUNNER" "${VMRUN_PREFIX[@]}" "${step[@]}")
elif [ "${#VMRUN_PREFIX[@]}" -gt 0 ]; then
  step=("${VMRUN_PREFIX[@]}" "${step[@]}")
fi
srun --kill-on-bad-exit=1 --label ${VMRUN_SRUN[@]+"${VMRUN_SRUN[@]}"} "${step[@]}" &
task=$!
watcher=
if [ -n "$agent" ]; then  # the spec's watchers beside the step, until it ends
  python3 "$agent" step "$task" $$ <<< "$VMRUN_LAUNCH" >/dev/null 2>&1 &
  watcher=$!
fi
while :; do  # a trapped signal ends `wait` early: wait again until srun has ended
  wait "$task"
  rc=$?
  kill -0 "$task" 2>/dev/null || break
done
if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null; wait "$watcher" 2>/dev/null; fi
# torchrun exits 1 when a worker fails (srun passes on the worst task's): the worker's code
if [ "$rc" != 0 ] && [ "$VMRUN_LAUNCHER" = torchrun ] && [ -n "$agent" ]; then
  code=$(python3 "$agent" failure "$rc" <<< "$VMRUN_LAUNCH" 2>/dev/null)
  case $code in '' | *[!0-9]*) ;; *) rc=$code ;; esac
fi
# stopped by its hang watcher (--on-hang stop): 124, as on hosts (run_agent.py)
if [ "$rc" != 0 ] && [ -e "$rec/hang_stopped" ]; then rc=124; fi
# stopped at its --max-cost (it saved, or caught nothing), unless it finished meanwhile
if [ -e "$rec/budget" ] && { [ "$rc" != 0 ] || [ -e "$VMRUN_REQUEUE_FILE" ]; }; then
  mark budget "the run has cost --max-cost $budget_cap: stopped, its work saved"
  date +%s > "$rec/stopped"
  ended budget
  tell stopped ""
  exit 0
fi
if [ -e "$VMRUN_REQUEUE_FILE" ]; then
  # the time limit's requeues so far (--recover's are `recovery` ends: not counted here)
  requeues=$(awk '$2 == "requeue" { n++ } END { print n + 0 }' "$rec/exit" 2>/dev/null)
  if [ "${requeues:-0}" -lt "$VMRUN_MAX_REQUEUES" ]; then
    ended requeue
    mark requeue "attempt $attempt saved its state; requeueing job $SLURM_JOB_ID"
    tell requeue ""
    vmrun_requeued=1
    # scontrol requeue can hang; the requeue ends this script
    if timeout 60 scontrol requeue "$SLURM_JOB_ID"; then sleep 60; fi
    mark failed "scontrol requeue $SLURM_JOB_ID did not take"
    rc=75
  else
    mark failed "the run asked to be requeued again, but --max-requeues $VMRUN_MAX_REQUEUES is spent"
    rc=75
  fi
fi
if [ ! -e "$VMRUN_REQUEUE_FILE" ] && [ "${VMRUN_MAX_RECOVERIES:-0}" -gt 0 ]; then
  vmrun_recover_end "$rc"  # returns only when the run is not brought back
  # shellcheck disable=SC2154  # slurm_recover.bash's
  rc=$vmrun_rc
fi
ended "$rc"
mark exit "$rc"
tell "" "$rc"
exit "$rc"
