# A line from vmrun in a run's log, beside the run's own (appended: O_APPEND, as the run's
# writes are): sh run_note.sh RUNS_DIR RUN_ID TEXT... -> `vmrun: TEXT` in its log. What a
# run's supervisor did (a recovery, giving up) is read with the run's lines (`vmrun logs`).
# Exit 3: no such run here.
base=$1 id=$2
shift 2
rec=$base/$id
case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
[ -f "$rec/run.json" ] || exit 3
printf 'vmrun: %s\n' "$*" >> "$rec/log"
