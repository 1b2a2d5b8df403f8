# A run's supervising shell, started detached by run_start.sh in a session of its own:
#   sh run_supervise.sh REC MODE MARKS CMD...
# writes pid_start and pid, runs CMD with its output in REC/log (appended for MODE resume)
# and run_marks.py (MARKS, its path) beside it when the host has python3, then writes
# exit_code unless the run was stopped, and tells the run's end to its notify.json's
# webhooks (notify_send.py, beside MARKS; what it could not send is a line in the log).
# exit_code is the run's own: when torchrun exits 1 because a worker failed, the first failed
# worker's code (run_failure.py reads torchrun's summary, and writes failure.json: which rank,
# where). Once exit_code is there the run has ended, for every reader, though this shell
# may still be telling it. 75: the run stopped after its snapshot to go on elsewhere (REC/requeue,
# written on a spot interruption notice: spot_watch.py). 124: its hang watcher stopped it.
# A run its budget watcher stopped (REC/budget) is recorded as stopped.
rec=$1; mode=$2; marks=$3; shift 3
# shellcheck disable=SC2086  # the fields after the command name, split on purpose
(read -r l < /proc/$$/stat; set -- ${l##*) }; echo "${20}") > "$rec/pid_start"
echo $$ > "$rec/pid.tmp" && mv "$rec/pid.tmp" "$rec/pid"
# appended either way (O_APPEND): the bucket copier (store_sync.sh) adds its lines beside
[ "$mode" = resume ] || : > "$rec/log"
exec >> "$rec/log"
m=
if command -v python3 > /dev/null 2>&1; then
  python3 "$marks" "$rec" $$ < /dev/null > /dev/null 2>&1 &
  m=$!
fi
"$@" 2>&1 < /dev/null
rc=$?
rm -f "$rec/failure.json"
if [ -n "$m" ]; then
  kill -TERM "$m" 2>/dev/null; wait "$m"
  if [ "$rc" = 1 ]; then
    c=$(python3 "${marks%/*}/run_failure.py" "$rec" "$rec/log" "$rc" \
      "$(cat "$rec/log_start" 2>/dev/null)" < /dev/null 2>/dev/null)
    case $c in '' | *[!0-9]*) ;; *) rc=$c ;; esac
  fi
fi
# stopped after a snapshot to go on elsewhere (a spot notice: the template wrote the requeue file)
if [ "$rc" = 0 ] && [ -s "$rec/requeue" ]; then rc=75; fi
# stopped by its hang watcher (--on-hang stop, hang_watch.py): 124, as timeout(1) says it
if [ "$rc" != 0 ] && [ -e "$rec/hang_stopped" ]; then rc=124; fi
# stopped at its --max-cost (budget_watch.py), unless it finished meanwhile: stopped, as by the user
if [ "$rc" != 0 ] && [ -e "$rec/budget" ]; then echo budget > "$rec/stopped"; fi
if [ ! -e "$rec/stopped" ]; then
  echo "$rc" > "$rec/exit_code.tmp" && mv "$rec/exit_code.tmp" "$rec/exit_code"
fi
if [ -r "$rec/notify.json" ] && command -v python3 > /dev/null 2>&1; then
  python3 "${marks%/*}/notify_send.py" "$rec" send < /dev/null 2>&1
fi
