# Stop a run: sh -c SOURCE vmrun-stop RUNS_DIR ID GRACE_CS [WHY]
# WHY (kept in REC/stopped, read back by run_list.sh): `user` (vmrun stop, the default), or
# vmrun's own reason: `failure` (another node failed), `start` (a start that failed on
# another node), `resume` (a leftover before the next attempt), `replaced` (an attempt
# another one took over). Only the user's stop (and budget_watch.py's `budget`) means the
# run is to end: a --recover supervisor brings back the others.
# TERM every process of the run, KILL what is left after GRACE_CS hundredths of a second of
# wall-clock time, and verify none is left. Prints TERM/KILL/LEFT lines with the pids
# concerned. The whole process table is read by three processes at a time (before TERM,
# while killing, at the end); during the grace only the run's own pids are watched, so a
# host with thousands of processes keeps the grace.
# shellcheck disable=SC2086,SC2046  # pid lists and /proc stat fields are split on purpose
base=$1; id=$2; grace=$3; why=${4:-user}
d="$HOME/$base/$id"
[ -f "$d/run.json" ] || { echo "vmrun: no run $id on this host" >&2; exit 3; }
# vmrun-inline: run_alive.sh
# The run's session: the command's, which its agent started (REC/session: PID START), unless
# that number now names another process (a dead leader's number is not reused while its
# session has members). The agent is no member: it makes the bucket copy's last pass. A
# record without REC/session (an older agent's) has its agent as the session's leader.
sess='' born=''
read -r sess born 2>/dev/null < "$d/session"
case $sess in *[!0-9]*) sess= ;; esac
if [ -n "$sess" ] && [ -r "/proc/$sess/stat" ]; then
  read -r l < "/proc/$sess/stat" 2>/dev/null || l=
  set -- ${l##*) }
  [ "${20:-}" = "$born" ] || sess=
elif ! [ -f "$d/session" ]; then
  sess=$(cat "$d/pid" 2>/dev/null)
  if [ -n "$sess" ] && [ -r "/proc/$sess/stat" ] && ! run_proc "$d"; then sess=; fi
fi
# Members: every process of the run's session, and every process carrying the run's id
# (torchrun's workers run in sessions of their own; a child that cleared its environment
# stays in the session). Three processes read the whole table, however large it is: awk over
# every stat line (pid first; the session is the 4th field after the command's last ")"),
# and one grep over every environment (NUL-separated: -z).
members() {
  {
    if [ -n "$sess" ]; then
      cat /proc/[0-9]*/stat 2>/dev/null \
        | awk -v s="$sess" '{ pid = $1; sub(/.*\) /, ""); if ($4 == s) print pid }'
    fi
    grep -lzx "VMRUN_RUN_ID=$id" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3
  } | sort -un | grep -vx "$$"
}
running() {  # the given pids that still exist and are not zombies
  for p in "$@"; do
    [ -r "/proc/$p/stat" ] || continue
    read -r l < "/proc/$p/stat" 2>/dev/null || continue
    set -- ${l##*) }
    [ "$1" != Z ] && echo "$p"
  done
}
centis() {  # the host's uptime in hundredths of a second: a clock no process is started for
  read -r up _ < /proc/uptime
  echo "${up%.*}${up#*.}"
}
wait_gone() {  # wait_gone CENTISECONDS PID...: until none runs, or the time is up
  until=$(( $(centis) + $1 )); shift
  while [ -n "$(running "$@")" ] && [ "$(centis)" -lt "$until" ]; do sleep 0.1; done
}
pids=$(running $(members))
if [ ! -e "$d/exit_code" ]; then  # the first reason stands, but the user's word wins
  was=$(head -n 1 "$d/stopped" 2>/dev/null)
  case $why in user | budget) was= ;; esac
  [ -n "$was" ] || echo "$why" > "$d/stopped"
fi
if [ -n "$pids" ]; then
  echo TERM $pids
  kill -TERM $pids 2>/dev/null
  wait_gone "$grace" $pids
  # KILL what is left, and whatever it spawned meanwhile, until none is left (5 s at most).
  left=$(running $(members))
  killed=
  until=$(( $(centis) + 500 ))
  while [ -n "$left" ] && [ "$(centis)" -lt "$until" ]; do
    killed="$killed $left"
    kill -KILL $left 2>/dev/null
    sleep 0.05
    left=$(running $(members))
  done
  [ -n "$killed" ] && echo KILL $(printf '%s\n' $killed | sort -un)
fi
echo LEFT $(running $(members))
if [ ! -e "$d/exit_code" ]; then
  echo 143 > "$d/exit_code.tmp" && mv "$d/exit_code.tmp" "$d/exit_code"
fi
# The agent ends once the exit code is there (3 s at most), but for the bucket copy's last
# pass (REC/store.pid names it then): that goes on without the run.
if alive_run "$d"; then
  read -r copying _ 2>/dev/null < "$d/store.pid" || copying=
  # shellcheck disable=SC2154  # run_alive.sh's, inlined above
  [ "$copying" = "$_ar_p" ] || wait_gone 300 "$_ar_p"
fi
