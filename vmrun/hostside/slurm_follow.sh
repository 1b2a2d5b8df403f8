# slurm_follow.sh RECORD_DIR JOB LINES POLL LIMIT: a job's log (its last LINES lines, 0: all)
# as it grows, with its state changes between the lines (`\035vmrun state STATE|REASON`),
# until the job has ended (`\035vmrun end STATE`: sacct's or squeue's last state; empty when
# neither knows); then the first failed worker where torchrun named one (`\035vmrun failure
# JSON`: failure.json, slurm_job.bash) and the exit record (`\035vmrun exits ...`).
# Only an answer ends it: squeue failing (the controller down, busy, restarting) keeps the
# last state, says so once (`\035vmrun unreachable ERROR`, then `\035vmrun reachable`), and
# after LIMIT seconds without an answer gives up (`\035vmrun lost SECONDS`): the job may run on.
# HERE (a cluster without a shared folder: 1): the job's log is on its batch node; once the
# job is placed on another node than this one, say which (`\035vmrun moved NODE`) and end.
d=$1 job=$2 lines=$3 poll=$4 limit=$5 here=${6:-}
fmt='%T|%r'
if [ -n "$here" ]; then
  fmt='%T|%r|%B'
  names=" $(hostname -s 2>/dev/null) $(hostname 2>/dev/null) "
fi
# vmrun-inline: _slurm_unanswered.sh
mark() { printf '\035vmrun %s\n' "$*"; }
final() {  # STATE: whether Slurm's state is an end
  case $1 in
    COMPLETED*|FAILED*|CANCELLED*|TIMEOUT*|NODE_FAIL*|OUT_OF_MEMORY*|BOOT_FAIL*|DEADLINE*|PREEMPTED*)
      return 0 ;;
  esac
  return 1
}
(
  err=$(mktemp) || exit 1
  trap 'rm -f "$err"' EXIT
  trap 'exit 1' HUP INT TERM  # through the EXIT trap: the channel went away
  last='' at=''
  away() {  # whether the job's batch node is another than this one (it says so, and ends)
    [ -n "$at" ] || return 1
    case $names in *" $at "*) return 1 ;; esac
    mark moved "$at"
  }
  while :; do
    if s=$(squeue -h -j "$job" --states=all -o "$fmt" 2>"$err"); then
      s=$(printf '%s\n' "$s" | head -n 1)
      if [ -n "$here" ] && [ -n "$s" ]; then
        b=${s##*|} s=${s%|*}
        case $b in ''|n/a|N/A|'(null)'|None) ;; *) at=$b ;; esac
        away && exit 3
      fi
    else
      unanswered "$err" "$limit"
      case $? in
        0) s= ;;  # the controller no longer knows the job (older Slurm: an error)
        1) sleep "$poll"; continue ;;  # no answer: the job may well run on
        *) exit 0 ;;
      esac
    fi
    answered
    if [ -z "$s" ]; then  # no longer listed: it ended; accounting says how, where it exists
      away && exit 3
      s=$(sacct -n -P -X -j "$job" -o State 2>/dev/null | head -n 1)
      s=${s%% *}
      final "$s" || s=
      mark end "$s"
      exit 0
    fi
    if [ "$s" != "$last" ]; then mark state "$s"; fi
    if final "$s"; then
      mark end "${s%%|*}"
      exit 0
    fi
    last=$s
    sleep "$poll"
  done
) &
w=$!
if [ "$lines" -gt 0 ]; then from=$lines; else from=+1; fi
tail -n "$from" -F -s 0.5 --pid="$w" "$d/job.log" 2>/dev/null
wait "$w"
[ $? -eq 3 ] && exit 0  # moved: its node says how it ended
exits=
if [ -r "$d/exit" ]; then exits=$(tr '\n' ' ' < "$d/exit"); fi
if [ -r "$d/failure.json" ]; then mark failure "$(head -n 1 "$d/failure.json" | head -c 4096)"; fi
mark exits "$exits"
