# Every remote command vmrun runs: sh ~/.vmrun/lib/<v>/command_wrapper.sh CWD BEAT BIN MARK CMD ARGS...
# (stdin: the environment header, then held open for as long as the command may run)
# - MARK (a folder relative to the home, or empty): while CMD runs, MARK/<this shell's pid>
#   holds this shell's start time (/proc/PID/stat), so the autostop watchdog counts vmrun's
#   own work as activity (a marker whose pid no longer runs with that start time is stale);
#   at the end the marker goes and MARK/.ended is touched (work that ended since a check).
#   Empty for what only looks (status, watch-gpus), which must not keep a host up.
# - exports the header's variables (NAME=base64 lines, an empty line ends them); puts
#   ~/BIN first on PATH (tools that vmrun installs, and shims a user wants every vmrun
#   command to see); cd to CWD if not empty;
# - runs CMD in a new session (setsid) with stdin from /dev/null;
# - a watcher waits for EOF on the channel's stdin; EOF while CMD runs means the client
#   went away, so it kills CMD's whole process group (TERM, then KILL after 5 s), and
#   exits as soon as the group is gone.
# - BEAT (seconds, or empty): the client also sends a line at least that often, and BEAT
#   seconds without one count as gone too. EOF never arrives while the link is down, so
#   an endless command (watch-gpus) would otherwise outlive its client until sshd gives
#   up on the dead TCP connection (many minutes). One bash `read -t` loop: sh has no -t.
d=$1 h=$2 b=$3 m=$4; shift 4
while IFS= read -r l && [ -n "$l" ]; do
  k=${l%%=*}
  v=$(printf %s "${l#*=}" | base64 -d && echo x) || { echo "vmrun: bad env" >&2; exit 125; }
  export "$k=${v%x}"
done
PATH="$HOME/$b:$PATH"; export PATH
if [ -n "$d" ]; then cd "$d" || exit 126; fi
if [ -n "$m" ]; then
  m=$HOME/$m
  [ -d "$m" ] || mkdir -p "$m" 2>/dev/null
  # shellcheck disable=SC2086  # the fields after the command name, split on purpose
  (read -r l < /proc/$$/stat; set -- ${l##*) }; echo "${20}") 2>/dev/null > "$m/$$"
fi
exec 3<&0
setsid "$@" </dev/null 3<&- &
c=$!
# shellcheck disable=SC2016  # bash expands $1 itself
{ if [ -n "$h" ]; then bash -c 'while IFS= read -r -t "$1" _; do :; done' vmrun-beat "$h"
  else cat >/dev/null; fi
  kill -TERM -"$c" || exit 0; i=0
  while kill -0 -"$c" && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; kill -KILL -"$c"
} <&3 >/dev/null 2>&1 &
w=$!
exec 3<&-
wait "$c"; r=$?
kill "$w" 2>/dev/null
if [ -n "$m" ]; then rm -f "$m/$$"; : > "$m/.ended"; fi 2>/dev/null
exit "$r"
