# Start a run detached and record it:
#   sh run_start.sh REC WORKDIR ID META MODE BANNER OUT LIB ALONE CMD...
# REC: the run's record folder (relative to $HOME, or absolute); META: run.json's text;
# MODE: "new" starts the log afresh, "resume" (another attempt of the same run) appends to it
# after BANNER (when not empty) and clears the last attempt's pid/exit_code/stopped; OUT: the
# run's output folder (relative to the home, or absolute), for progress from its metrics;
# LIB: the folder of vmrun's host-side files (absolute): the run's supervising shell is its
# run_supervise.sh (which tells the run's end with notify_send.py when VMRUN_NOTIFY_CONFIG gave
# the run a notify.json), and run_marks.py, which the host's python3 (if any) runs beside the run,
# writes log.times (when each log line was written). ALONE: 1 refuses to start while another
# run recorded beside REC is alive (`BUSY <its id>`, exit 3; alive by run_alive.sh's rule), 0
# starts anyway (--allow-concurrent). That check and the start hold one lock (flock on
# .start.lock beside the records) until the pid is written, so two starts at once cannot
# both find the GPUs free.
# The run's bucket copy (`train --store`, on the node that holds its outputs): VMRUN_STORE_TO
# (bucket/prefix/RUN_ID), VMRUN_STORE_URL (the same as shown), VMRUN_STORE_PYTHON (where
# the mover is looked for), VMRUN_STORE_SINCE (1: OUT is the work directory, so only what
# changed since the run first started is the run's) and VMRUN_STORE_CONFIG (rclone's
# config, credentials maybe): none in the run's environment; store_sync.sh's copier starts
# once the pid is written (an earlier attempt's copier is replaced).
# A run its supervisor watches (`train --recover`: VMRUN_SPOT_WATCH=1): spot_watch.py beside it,
# started once the pid is written, tells it a cloud's warning; the run's ranks get
# VMRUN_REQUEUE_FILE (REC/requeue: the template's preemption protocol, which ends such a run with
# exit code 75, run_supervise.sh). Every run is told VMRUN_SNAPSHOT_SIGNAL (SIGUSR1: snapshot now).
# A run watched for hangs (`train --hang-timeout`: VMRUN_HANG_WATCH="SECONDS ACTION RANKED"):
# hang_watch.py beside it, started once the pid is written; every run's ranks get
# VMRUN_BEAT_DIR (REC/beat: the trainer's heartbeats, progress the watcher reads).
# A run with a cap on its cost (`train --max-cost`: VMRUN_BUDGET_WATCH="SECONDS CAP"):
# budget_watch.py beside it, started once the pid is written, stops it after SECONDS with its
# work saved; its ranks get VMRUN_REQUEUE_FILE, as a --recover run's do.
# Beside the run (detached): run_provenance.py, which writes provenance.json, environment.txt and
# versions.json into REC (VMRUN_PROVENANCE, above).
# Prints the log's line count before this attempt, then the pid of the run's supervising
# shell: a session leader (setsid), so its pid is the run's session id too; pid_start (its
# start time in /proc/PID/stat) tells that session from a later one reusing the number.
# vmrun-inline: run_alive.sh
rec=$1; wd=$2; id=$3; meta=$4; mode=$5; banner=$6; out=$7; lib=$8; alone=$9; shift 9
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
    # ended (its shell is writing the exit code) or stopped: not running, as the preflight says
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
  rm -f "$rec/pid" "$rec/pid_start" "$rec/exit_code" "$rec/stopped" "$rec/failure.json" \
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
printf '%s\n' "$meta" > "$rec/run.json.tmp" && mv "$rec/run.json.tmp" "$rec/run.json"
# the run's notifications (VMRUN_NOTIFY_CONFIG, over stdin like every value): a file only the user
# reads, never in the run's environment; each attempt's end is told afresh
rm -rf "$rec"/notified.* "$rec/notify.json"
if [ -n "${VMRUN_NOTIFY_CONFIG:-}" ]; then
  (umask 077 && printf '%s\n' "$VMRUN_NOTIFY_CONFIG" > "$rec/notify.json") || exit 125
fi
unset VMRUN_NOTIFY_CONFIG
# the run's provenance (vmrun.runs.provenance): the uncommitted diff (VMRUN_CODE_PATCH: base64 of
# gzip) into code.patch, and who describes its environment and hardware (VMRUN_PROVENANCE: an
# interpreter for run_provenance.py); neither in the run's environment
if [ "$mode" = resume ] && [ -f "$rec/code.patch" ]; then
  mv "$rec/code.patch" "$rec/code.patch.$((attempt - 1))"  # the earlier attempt's
fi
rm -f "$rec/code.patch"
if [ -n "${VMRUN_CODE_PATCH:-}" ]; then
  if printf '%s' "$VMRUN_CODE_PATCH" | base64 -d | gzip -dc > "$rec/code.patch.tmp"; then
    mv "$rec/code.patch.tmp" "$rec/code.patch"
  else
    rm -f "$rec/code.patch.tmp"
  fi
fi
prov=${VMRUN_PROVENANCE:-}
unset VMRUN_CODE_PATCH VMRUN_PROVENANCE
store_to=${VMRUN_STORE_TO:-} store_url=${VMRUN_STORE_URL:-} store_py=${VMRUN_STORE_PYTHON:-}
store_since=${VMRUN_STORE_SINCE:-} store_cfg=${VMRUN_STORE_CONFIG:-}
unset VMRUN_STORE_TO VMRUN_STORE_URL VMRUN_STORE_PYTHON VMRUN_STORE_SINCE VMRUN_STORE_CONFIG
spot=${VMRUN_SPOT_WATCH:-}
hang=${VMRUN_HANG_WATCH:-}
budget=${VMRUN_BUDGET_WATCH:-}
unset VMRUN_SPOT_WATCH VMRUN_HANG_WATCH VMRUN_BUDGET_WATCH
if [ "$spot" = 1 ] || [ -n "$budget" ]; then
  export VMRUN_REQUEUE_FILE="$rec/requeue" VMRUN_REQUEUE_ON_TERM=0
fi
export VMRUN_SNAPSHOT_SIGNAL=SIGUSR1 VMRUN_BEAT_DIR="$rec/beat"
mkdir -p "$rec/nccl"  # NCCL's debug files, torch's flight recorder dumps (node_launch.py)
echo "$attempt" > "$rec/attempt"
echo "$lines" > "$rec/log_start"
case "$out" in /*) ;; *) out="$HOME/$out" ;; esac
printf '%s\n' "$out" > "$rec/out_dir"
[ -f "$rec/first_started" ] || date +%s > "$rec/first_started"
cd "$wd" 2>/dev/null || { echo "vmrun: the work directory $wd is missing" >&2; exit 126; }
if [ "$mode" = resume ] && [ -n "$banner" ]; then printf '%s\n' "$banner" >> "$rec/log"; fi
[ "$mode" = resume ] || : > "$rec/log.times"
# detached and niced, and not one of the run's processes (no VMRUN_RUN_ID): the run starts now
if [ -n "$prov" ]; then
  nice=
  command -v nice > /dev/null 2>&1 && nice="nice -n 10"
  # shellcheck disable=SC2086  # `nice -n 10`, or nothing
  setsid -f $nice "$prov" "$lib/run_provenance.py" "$rec" < /dev/null > /dev/null 2>&1 8>&-
fi
export VMRUN_RUN_ID="$id" VMRUN_RUN_DIR="$rec"
setsid -f sh "$lib/run_supervise.sh" "$rec" "$mode" "$lib/run_marks.py" "$@" \
  < /dev/null > /dev/null 2>&1 8>&-
i=0
while [ ! -s "$rec/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
[ -s "$rec/pid" ] || { echo "vmrun: the run did not start" >&2; exit 125; }
if [ "$spot" = 1 ]; then
  if command -v python3 > /dev/null 2>&1; then
    (unset VMRUN_RUN_ID VMRUN_RUN_DIR; exec setsid -f python3 "$lib/spot_watch.py" "$rec" \
      "$(cat "$rec/pid")") < /dev/null > /dev/null 2>&1 8>&-
  else
    echo "vmrun: no python3 on this host: spot interruption notices are not watched" >> "$rec/log"
  fi
fi
if [ -n "$hang" ]; then
  if command -v python3 > /dev/null 2>&1; then
    (
      # shellcheck disable=SC2086  # SECONDS ACTION RANKED, a word each
      set -- $hang
      unset VMRUN_RUN_ID VMRUN_RUN_DIR
      exec setsid -f python3 "$lib/hang_watch.py" "$rec" "$(cat "$rec/pid")" "$1" "$2" "$id" "$3"
    ) < /dev/null > /dev/null 2>&1 8>&-
  else
    echo "vmrun: no python3 on this host: hangs are not watched" >> "$rec/log"
  fi
fi
if [ -n "$budget" ]; then
  if command -v python3 > /dev/null 2>&1; then
    (unset VMRUN_RUN_ID VMRUN_RUN_DIR; exec setsid -f python3 "$lib/budget_watch.py" "$rec" \
      "$(cat "$rec/pid")" "${budget%% *}" "${budget#* }") < /dev/null > /dev/null 2>&1 8>&-
  else
    echo "vmrun: no python3 on this host: --max-cost cannot stop the run here" >> "$rec/log"
  fi
fi
if [ -n "$store_to" ]; then
  since=''
  [ "$store_since" = 1 ] && since=$(cat "$rec/first_started")
  # the config by the environment of a subshell, never an argument (`env NAME=...` would be)
  (
    unset VMRUN_RUN_ID VMRUN_RUN_DIR
    VMRUN_STORE_CONFIG=$store_cfg
    export VMRUN_STORE_CONFIG
    exec sh "$lib/store_sync.sh" start "$rec" "$out" "$store_to" "$store_url" "$since" "$store_py"
  ) < /dev/null > /dev/null 2>&1 8>&- \
    || printf 'vmrun: the copy to %s did not start\n' "$store_url" >> "$rec/log"
fi
echo "$lines"
cat "$rec/pid"
