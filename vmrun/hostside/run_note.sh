# A line from vmrun in a run's log, beside the run's own (appended: O_APPEND, as the run's
# writes are): sh run_note.sh RUNS_DIR RUN_ID KIND TEXT... -> `vmrun: TEXT` in its log. What
# a run's supervisor did is read with the run's lines (`vmrun logs`); KIND `recovery` or
# `gave-up` also goes to the record's `recoveries` (KIND<TAB>TIME<TAB>TEXT<TAB>FACTS lines, which
# `status` counts and `report` reads; the bucket copy keeps them with the record). FACTS:
# VMRUN_NOTE_FACTS (a JSON object: downtime, epochs redone, which node took which one's place),
# else {}. KIND `recovering` (a recovery under way: `status` says so) is kept in the record's
# `recovering` alone, no log line, until the recovery's own note or a give-up. Exit 3: no
# such run here.
base=$1 id=$2 kind=$3
shift 3
rec=$base/$id
case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
[ -f "$rec/run.json" ] || exit 3
if [ "$kind" = recovering ]; then
  printf '%s\n' "$*" > "$rec/recovering.tmp" && mv "$rec/recovering.tmp" "$rec/recovering"
  exit 0
fi
rm -f "$rec/recovering"
printf 'vmrun: %s\n' "$*" >> "$rec/log"
case $kind in
  recovery | gave-up)
    printf '%s\t%s\t%s\t%s\n' "$kind" "$(date +%s)" "$*" "${VMRUN_NOTE_FACTS:-{\}}" \
      >> "$rec/recoveries" ;;
esac
