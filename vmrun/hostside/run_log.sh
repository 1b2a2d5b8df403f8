# A run's log: sh -c SOURCE vmrun-log RUNS_DIR ID FROM FOLLOW TIMES
# FROM: "+N" starts at line N, "N" the last N lines (0: all). FOLLOW 1 goes on until the
# run has ended: its exit_code is written (its agent may still be telling the end to
# webhooks; that is not the run) or that agent is gone; 0 prints what there is and ends.
# TIMES 1 prints log.times instead (when the log's lines were written; see run_agent.py).
d="$HOME/$1/$2"; from=$3; follow=$4
[ -f "$d/run.json" ] || { echo "vmrun: no run $2 on this host" >&2; exit 3; }
if [ "$5" = 1 ]; then
  [ -f "$d/log.times" ] && exec cat "$d/log.times"
  exit 0
fi
[ "$from" = 0 ] && from=+1
if [ "$follow" = 1 ]; then
  i=0
  while [ ! -s "$d/pid" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
  pid=$(cat "$d/pid" 2>/dev/null)
  touch "$d/log"
  if [ -n "$pid" ] && [ ! -e "$d/exit_code" ]; then
    # tail ends with a process: one that waits for the end, not tail's child (a zombie child
    # would count as alive to tail), in this command's group (gone when the client is)
    w=$(sh -c 'while [ ! -e "$1/exit_code" ] && kill -0 "$2" 2>/dev/null; do sleep 0.1; done \
      > /dev/null 2>&1 & echo $!' vmrun-log-end "$d" "$pid")
    exec tail -n "$from" -s 0.5 -F --pid="$w" "$d/log" 2>/dev/null
  fi
fi
[ -f "$d/log" ] || exit 0
exec tail -n "$from" "$d/log"
