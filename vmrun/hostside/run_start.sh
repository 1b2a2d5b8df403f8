# Start a run detached and record it:
#   sh -c SOURCE vmrun-start REC WORKDIR ID META MODE BANNER OUT MARKS CMD...
# REC: the run's record folder (relative to $HOME, or absolute); META: run.json's text;
# MODE: "new" starts the log afresh, "resume" (another attempt of the same run) appends to it
# after BANNER (when not empty) and clears the last attempt's pid/exit_code/stopped; OUT: the
# run's output folder (relative to the home, or absolute), for progress from its metrics;
# MARKS: run_marks.py's text, which the host's python3 (if any) runs beside the run to write
# log.times (when each log line was written).
# Prints the log's line count before this attempt, then the pid of the run's supervising
# shell: a session leader (setsid), so its pid is the run's session id too; pid_start (its
# start time in /proc/PID/stat) tells that session from a later one reusing the number.
rec=$1; wd=$2; id=$3; meta=$4; mode=$5; banner=$6; out=$7; marks=$8; shift 8
case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
mkdir -p "$rec" || exit 125
lines=0
attempt=1
if [ "$mode" = resume ]; then
  rm -f "$rec/pid" "$rec/pid_start" "$rec/exit_code" "$rec/stopped"
  [ -f "$rec/log" ] && lines=$(wc -l < "$rec/log")
  attempt=$(( $(cat "$rec/attempt" 2>/dev/null || echo 1) + 1 ))
fi
printf '%s\n' "$meta" > "$rec/run.json.tmp" && mv "$rec/run.json.tmp" "$rec/run.json"
echo "$attempt" > "$rec/attempt"
echo "$lines" > "$rec/log_start"
case "$out" in /*) ;; *) out="$HOME/$out" ;; esac
printf '%s\n' "$out" > "$rec/out_dir"
[ -f "$rec/first_started" ] || date +%s > "$rec/first_started"
cd "$wd" 2>/dev/null || { echo "vmrun: the work directory $wd is missing" >&2; exit 126; }
if [ "$mode" = resume ] && [ -n "$banner" ]; then printf '%s\n' "$banner" >> "$rec/log"; fi
[ "$mode" = resume ] || : > "$rec/log.times"
export VMRUN_RUN_ID="$id" VMRUN_RUN_DIR="$rec"
# shellcheck disable=SC2016  # the inner script expands its own variables
setsid -f sh -c '
  rec=$1; mode=$2; marks=$3; shift 3
  (read -r l < /proc/$$/stat; set -- ${l##*) }; echo "${20}") > "$rec/pid_start"
  echo $$ > "$rec/pid.tmp" && mv "$rec/pid.tmp" "$rec/pid"
  if [ "$mode" = resume ]; then exec >> "$rec/log"; else exec > "$rec/log"; fi
  m=
  if command -v python3 > /dev/null 2>&1; then
    python3 -c "$marks" "$rec" $$ < /dev/null > /dev/null 2>&1 &
    m=$!
  fi
  "$@" 2>&1 < /dev/null
  rc=$?
  if [ -n "$m" ]; then kill -TERM "$m" 2>/dev/null; wait "$m"; fi
  if [ ! -e "$rec/stopped" ]; then
    echo $rc > "$rec/exit_code.tmp" && mv "$rec/exit_code.tmp" "$rec/exit_code"
  fi
' vmrun-run "$rec" "$mode" "$marks" "$@" < /dev/null > /dev/null 2>&1
i=0
while [ ! -s "$rec/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
echo "$lines"
cat "$rec/pid" 2>/dev/null || { echo "vmrun: the run did not start" >&2; exit 125; }
