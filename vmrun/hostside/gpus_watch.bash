# bash -c THIS vmrun-gpus RUN_ENV EXTRA_PATH APP_TAG OWNER_TAG STOP_TAG STOP_STATE NVIDIA_SMI
#   GPU_QUERY APPS_QUERY FORMAT [LOOP]   (vmrun.gpus.nvidia_smi builds the arguments)
# bash, not sh, for what keeps a watch from starting anything per refresh or per process:
# `coproc` (the processes query's pid and output), `read -t` (a timeout to notice the
# devices query ending), `read -d ''` (a pid's NUL-separated environ with a builtin) and an
# associative array of the pids already seen.
# - NVIDIA_SMI is `nvidia-smi` or the host's `nvidia_smi` override (`~/` allowed), looked up
#   on PATH plus EXTRA_PATH; the wrapper (vmrun.ssh.quoting) has put ~/.vmrun/bin first already.
# - The devices query writes to stdout untouched; its exit status is the channel's, so
#   "not found" (127) or "no driver" (9) reach the watcher as they are.
# - The processes query is read here: each row goes to stderr as `APP_TAG ROW`, after
#   `OWNER_TAG PID RUN_ID` the first time its pid appears. Every process of a run carries
#   RUN_ENV (vmrun.backends.hosts.records), even torchrun's workers in sessions of their own, so the
#   owner is read from /proc/PID/environ. Another user's process is unreadable: no owner.
# - `read -t 2` wakes up to notice the devices query ending while no process holds a GPU
#   (then the processes query prints nothing); a line cut by that timeout is kept in $buf.
# - The processes query is a coproc: bash 4.0+ gives its pid (process substitution's $!
#   needs 4.4), and fd 3, a copy of its output, outlives bash closing the coproc's own fds.
# - When either query ends, the other is stopped, and the script exits with the devices'
#   status once both are gone. Everything is in one process group, which the wrapper kills
#   when the channel goes away.
# - STOP_STATE (may be empty): the autostop watchdog's state file (vmrun.autostop), read with
#   a builtin at most every 2 s; when it (or whether its pid runs) changes, a line
#   `STOP_TAG HOST_NOW ALIVE STATE` goes to stderr (an empty STATE: not installed).
run_env=$1 extra=$2 app_tag=$3 owner_tag=$4 stop_tag=$5 stop_state=$6 p=$7 g=$8 a=$9 f=${10}
shift 10
stop_seen="0 " stop_next=0
autostop() {
  [ -n "$stop_state" ] && [ "$SECONDS" -ge "$stop_next" ] || return 0
  stop_next=$((SECONDS + 2))
  local line='' pid alive=0 now
  [ -f "$stop_state" ] && IFS= read -r line < "$stop_state"
  pid=${line#pid=} pid=${pid%%$'\t'*}
  [ -n "$line" ] && [ -d "/proc/$pid" ] && alive=1
  [ "$alive $line" != "$stop_seen" ] || return 0
  stop_seen="$alive $line"
  printf -v now '%(%s)T' -1
  printf '%s %s %s %s\n' "$stop_tag" "$now" "$alive" "$line" >&2
}
autostop
# shellcheck disable=SC2088 # a literal `~/` from vmrun.toml, expanded here
case $p in "~/"*) p=$HOME/${p#??} ;; esac
PATH=$PATH:$extra
export PATH
"$p" "$g" "$f" "$@" &
gpu=$!
coproc APPS { exec "$p" "$a" "$f" "$@"; }
apps=$APPS_PID
exec 3<&"${APPS[0]}"
declare -A seen
buf=
while :; do
  IFS= read -r -t 2 -u 3 line
  rc=$?
  autostop
  if [ $rc -gt 128 ]; then
    buf=$buf$line
    kill -0 "$gpu" 2>/dev/null && continue
    break
  fi
  line=$buf$line buf=
  if [ -n "$line" ]; then
    r=${line#*,} r=${r#*,} pid=${r%%,*} pid=${pid// /}
    case $pid in
    '' | *[!0-9]*) ;;
    *)
      if [ -z "${seen[$pid]}" ]; then
        seen[$pid]=1 own=
        while IFS= read -r -d '' e; do
          case $e in "$run_env"=*) own=${e#*=}; break ;; esac
        done 2>/dev/null </proc/"$pid"/environ
        printf '%s %s %s\n' "$owner_tag" "$pid" "$own" >&2
      fi ;;
    esac
    printf '%s %s\n' "$app_tag" "$line" >&2
  fi
  [ $rc -eq 0 ] || break
done
exec 3<&-
kill "$apps" 2>/dev/null
wait "$apps"
wait "$gpu"
