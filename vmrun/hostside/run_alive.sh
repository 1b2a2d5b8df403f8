# alive_run REC: is the run recorded in REC alive? The one rule every host script asks by
# (run_list.sh, run_start.sh, run_stop.sh, autostop_watch.sh inline this file with a
# `# vmrun-inline:` line; run_marks.py says the same in Python): REC/pid is a process that started when
# REC/pid_start says (field 22 of /proc/PID/stat; run_start.sh writes pid_start first), and
# is no zombie. A pid alone may name a later process that reused the number; a record
# without pid_start proves nothing. Only _ar_ variables are set: it is inlined elsewhere.
# run_proc REC: the first half, the pid still names the run's process (maybe a zombie, whose
# number is not reused yet); its state letter in $_ar_state.
run_proc() {
  _ar_p='' _ar_s='' _ar_l='' _ar_state=''
  read -r _ar_p 2>/dev/null < "$1/pid"
  case $_ar_p in '' | *[!0-9]*) return 1 ;; esac
  read -r _ar_s 2>/dev/null < "$1/pid_start"
  [ -n "$_ar_s" ] || return 1
  read -r _ar_l 2>/dev/null < "/proc/$_ar_p/stat" || return 1
  # shellcheck disable=SC2086  # the fields after the command name, split on purpose
  set -- ${_ar_l##*) }
  _ar_state=$1
  [ "${20}" = "$_ar_s" ]
}
alive_run() {
  run_proc "$1" && [ "$_ar_state" != Z ]
}
