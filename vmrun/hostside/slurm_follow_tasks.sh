# slurm_follow_tasks.sh RECORD_DIR JOB POLL LIMIT WORKDIR OUTPAT ERRPAT: a job from the user's
# own batch script (and each task of an array), followed to its end: its tasks' states as
# they change (`\035vmrun task KEY JOBID|STATE|REASON|HOST|EXIT`, KEY the array index, `-`
# outside an array), and each task's output and error files, from their first line, as
# Slurm's patterns name them once the task has a node: every line `\036KEY o|e\036TEXT`.
# The files each task got are kept in RECORD_DIR/files, the tasks' ends in RECORD_DIR/ended
# (`KEY STATE EXIT TIME ELAPSED`), then `\035vmrun ended KEY STATE EXIT ...`.
# Only an answer ends it: squeue failing keeps the last states, says so once
# (`\035vmrun unreachable ERROR`, then `\035vmrun reachable`), and after LIMIT seconds
# without an answer gives up (`\035vmrun lost SECONDS`): the job may run on.
d=$1 job=$2 poll=$3 limit=$4 work=$5 outpat=$6 errpat=$7
# vmrun-inline: _slurm_tasks.sh
# vmrun-inline: _slurm_unanswered.sh
mark() { printf '\035vmrun %s\n' "$*"; }
final() {
  case $1 in
    COMPLETED*|FAILED*|CANCELLED*|TIMEOUT*|NODE_FAIL*|OUT_OF_MEMORY*|BOOT_FAIL*|DEADLINE*|PREEMPTED*)
      return 0 ;;
  esac
  return 1
}
user=$(id -un)
err=$(mktemp) || exit 1
sleep 2147483647 &  # the tails live as long as this: stopped once the job has ended
sentinel=$!
trap 'kill "$sentinel" 2>/dev/null; rm -f "$err"' EXIT
trap 'exit 1' HUP INT TERM
# each line framed as it arrives: sed -u (GNU) or, without it, the shell's own read
if sed -u q </dev/null >/dev/null 2>&1; then unbuffered=1; else unbuffered=0; fi
frame() {  # PREFIX
  if [ "$unbuffered" = 1 ]; then
    sed -u "s/^/$1/"
  else
    while IFS= read -r l || [ -n "$l" ]; do printf '%s%s\n' "$1" "$l"; done
  fi
}
follow() {  # KEY STREAM PATH
  printf '%s %s %s\n' "$1" "$2" "$3" >> "$d/files"
  tail -n +1 -F -s 0.3 --pid="$sentinel" -- "$3" 2>/dev/null |
    frame "$(printf '\036%s %s\036' "$1" "$2")" &
}
seen=' ' last='' now=''
while :; do
  if ! q=$(tasks "$job" 2>"$err"); then
    unanswered "$err" "$limit"
    case $? in
      0) q= ;;  # the controller no longer knows the job
      1) sleep "$poll"; continue ;;  # no answer: the job may well run on
      *) exit 0 ;;
    esac
  fi
  answered
  [ -n "$q" ] || break
  open=0
  while IFS= read -r line; do
    IFS='|' read -r id _ key _ host state code _ used _ reason <<EOT
$line
EOT
    case $key in N/A|"") key=- ;; esac
    reason=$(printf '%s' "$reason" | tr -d ' ')
    if ! final "$state"; then open=1; fi
    now="$id|$state|$reason|$host|$code|$used"
    case $last in *" $key=$now "*) ;; *) mark task "$key" "$now" ;; esac
    case $seen in *" $key "*) continue ;; esac
    paths=$(files "$line" "$work" "$outpat" "$errpat" "$user")
    [ -n "$paths" ] || continue
    while read -r k s p; do follow "$k" "$s" "$p"; done <<EOT
$paths
EOT
    seen="$seen$key "
  done <<EOT
$q
EOT
  last=" $(printf '%s\n' "$q" | awk -F'|' '{ k = $3; if (k == "N/A" || k == "") k = "-"; r = $11; gsub(/ /, "", r); printf "%s=%s|%s|%s|%s|%s|%s ", k, $1, $6, r, $5, $7, $9 }')"
  [ "$open" = 1 ] || break
  sleep "$poll"
done
kill "$sentinel" 2>/dev/null
wait
echo  # a file's last line may have had no newline: the marks start on a line of their own
t=$(date +%s)
acc=$(sacct -n -P -X -j "$job" -o JobID,State,ExitCode 2>/dev/null)
ends=
for entry in $last; do
  key=${entry%%=*} rest=${entry#*=}
  state=$(printf '%s' "$rest" | cut -d'|' -f2)
  code=$(printf '%s' "$rest" | cut -d'|' -f5)
  if ! final "$state"; then  # it left the queue between two looks: accounting may know
    id=$job
    [ "$key" = - ] || id=${job}_$key
    a=$(printf '%s\n' "$acc" | awk -F'|' -v id="$id" '$1 == id { print $2 "|" $3; exit }')
    state=${a%%|*} code=${a#*|}
    case $code in *:*) code=$(( ${code%%:*} * 256 + ${code#*:} )) ;; *) code= ;; esac
    state=${state%% *}
    final "$state" || state=ENDED
  fi
  used=$(printf '%s' "$rest" | cut -d'|' -f6)
  printf '%s %s %s %s %s\n' "$key" "$state" "${code:--}" "$t" "${used:--}" >> "$d/ended"
  ends="$ends $key $state ${code:--}"
done
mark ended "$ends"
