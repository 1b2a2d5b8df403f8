# Start a run detached and record it:
#   sh run_start.sh     (the launch spec, vmrun.runs.launch_spec: one JSON document in
#                        VMRUN_LAUNCH, from the command wrapper's stdin header, never argv)
# What must be shell is here: the start lock, the busy check, the record's preparation and
# the new session; everything else is the run's agent's (run_agent.py beside this file, under
# the host's python3), which reads the spec from its stdin: run.json, the secrets' 0600 files
# (notify.json; the bucket's config goes to store_sync.sh), code.patch, the command, and every
# watcher of the run (log.times, hangs, the cost cap, spot notices, the bucket copy, the end's
# notification, provenance), as parts of the one process that supervises the run.
# The spec's rec: the run's record folder (relative to $HOME, or absolute); mode "new" starts
# the log afresh, "resume" (another attempt of the same run) appends to it after the banner
# and clears the last attempt's pid/exit_code/stopped; alone: refuses to start while another
# run recorded beside REC is alive (`BUSY <its id>`, exit 3; alive by run_alive.sh's rule),
# else starts anyway (--allow-concurrent). That check and the start hold one lock (flock on
# .start.lock beside the records) until the pid is written, so two starts at once cannot
# both find the GPUs free.
# Each attempt is numbered in REC/attempt (the bucket copy's generation: store_sync.sh).
# Prints the log's line count before this attempt, then the pid of the run's agent (REC/pid:
# the run is alive while it lives, run_alive.sh); pid_start (its start time in
# /proc/PID/stat) tells it from a later process reusing the number.
# vmrun-inline: run_alive.sh
lib=${0%/*}
case "$lib" in /*) ;; *) lib="$PWD/$lib" ;; esac
spec=${VMRUN_LAUNCH:-}
unset VMRUN_LAUNCH
py=$(command -v python3 2> /dev/null) || py=
if [ -z "$py" ]; then
  echo "vmrun: no python3 on this host: vmrun's run agent needs one to start a run" >&2
  exit 125
fi
# the words the shell needs (rec id mode alone: one word each, as the spec checks them)
fields=$(printf '%s' "$spec" | "$py" "$lib/run_agent.py" fields) || exit 125
# shellcheck disable=SC2086  # four words, split on purpose
set -- $fields
rec=$1; id=$2; mode=$3; alone=$4
case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
base=${rec%/*}
mkdir -p "$base" || exit 125
if command -v flock > /dev/null 2>&1; then
  exec 8>> "$base/.start.lock" || exit 125
  flock -w 60 8 || { echo "vmrun: another run's start held $base/.start.lock for 60 s" >&2; exit 125; }
fi
if [ "$alone" = 1 ]; then
  busy=
  for d in "$base"/*/; do
    d=${d%/} && o=${d##*/}
    if [ "$o" = "$id" ] || ! [ -f "$d/run.json" ]; then continue; fi
    # ended (its agent is writing the exit code) or stopped: not running, as the preflight says
    if [ -e "$d/exit_code" ] || [ -e "$d/stopped" ]; then continue; fi
    if alive_run "$d"; then
      # the latest started, as the preflight names it
      # shellcheck disable=SC3013  # -nt: dash, bash and busybox sh have it
      if [ -z "$busy" ] || [ "$d/pid" -nt "$base/$busy/pid" ]; then busy=$o; fi
    fi
  done
  if [ -n "$busy" ]; then echo "BUSY $busy"; exit 3; fi
fi
mkdir -p "$rec" || exit 125
lines=0
attempt=1
if [ "$mode" = resume ]; then
  rm -f "$rec/pid" "$rec/pid_start" "$rec/session" "$rec/exit_code" "$rec/stopped" "$rec/failure.json" \
    "$rec/notice" "$rec/requeue" "$rec/hang" "$rec/hang_stopped" "$rec/budget"
  rm -rf "$rec/beat"
  [ -f "$rec/log" ] && lines=$(wc -l < "$rec/log")
  attempt=$(cat "$rec/attempt" 2>/dev/null || echo 1)
  # a record restored from the bucket may lag the generation the bucket's copy has seen
  # (store_sync.sh claims it before the record goes): the next attempt is newer than both
  claimed=$(cat "$rec/generation" 2>/dev/null || echo 0)
  case $attempt in '' | *[!0-9]*) attempt=1 ;; esac
  case $claimed in '' | *[!0-9]*) claimed=0 ;; esac
  [ "$claimed" -gt "$attempt" ] && attempt=$claimed
  attempt=$((attempt + 1))
fi
# each attempt's end is told afresh
rm -rf "$rec"/notified.* "$rec/notify.json"
mkdir -p "$rec/nccl"  # NCCL's debug files, torch's flight recorder dumps (node_launch.py)
echo "$attempt" > "$rec/attempt"
echo "$lines" > "$rec/log_start"
[ -f "$rec/first_started" ] || date +%s > "$rec/first_started"
# run.json, notify.json, code.patch, out_dir, the banner; 126: no work directory
printf '%s' "$spec" | "$py" "$lib/run_agent.py" prepare || exit $?
# detached, in a session of its own: the run starts now. The agent starts the command in
# a session of its own too (REC/session: what run_stop.sh stops) and carries neither the
# run's id nor a place in that session, so a stop leaves it its last pass of the bucket
# copy. VMRUN_AGENT (the run's id) names it as the run's agent, never a rank (stacks.py);
# it passes that on to nothing.
printf '%s' "$spec" \
  | VMRUN_AGENT=$id setsid -f "$py" "$lib/run_agent.py" run > /dev/null 2>&1 8>&-
i=0
while [ ! -s "$rec/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
[ -s "$rec/pid" ] || { echo "vmrun: the run did not start" >&2; exit 125; }
echo "$lines"
cat "$rec/pid"
