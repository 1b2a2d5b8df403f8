# The supervisor of a run (`train --recover`), started or stopped on its host:
#   sh supervisor_start.sh start DIR ENV CODE RUN_ID     detached, in a session of its own:
#     ENV/bin/python -m vmrun supervise RUN_ID, with vmrun's code from CODE (PYTHONPATH),
#     its settings from DIR (DIR/config.toml, DIR/project/vmrun.toml), its output in DIR/log;
#     its pid (and that pid's start time) in DIR/pid. One at a time: a live one is kept
#     (`RUNNING PID`), else `STARTED PID`.
#     A copy of this script goes into DIR and, where the host has cron, an @reboot line
#     (tagged with TAG, vmrun-supervisor:RUN_ID) starts the supervisor again at boot: it
#     goes on from its journal. `BOOT cron` or `BOOT none` says which.
#   sh supervisor_start.sh stop DIR     TERM, then KILL after 10 s; `STOPPED` or `GONE`
#   sh supervisor_start.sh forget DIR TAG   the @reboot line out of the crontab (at its end)
# VMRUN_SUPERVISOR_SECRETS (over stdin, never an argument): NAME=VALUE lines the supervisor
# needs (the bucket's keys when the run copies to one with yours), kept in DIR/secrets.env
# (0600) for its life; the supervisor reads them there.
mode=$1 dir=$2
case "$dir" in /*) ;; *) dir="$HOME/$dir" ;; esac
alive() {  # the supervisor named in DIR/pid still runs
  [ -f "$dir/pid" ] || return 1
  read -r p s < "$dir/pid" || return 1
  case $p in '' | *[!0-9]*) return 1 ;; esac
  [ -r "/proc/$p/stat" ] || return 1
  # shellcheck disable=SC2046  # the fields after the command name, split on purpose
  set -- $(sed 's/.*) //' "/proc/$p/stat")
  [ "$1" != Z ] && [ "${20}" = "$s" ]
}
unboot() {  # the crontab without TAG's line
  crontab -l 2>/dev/null | grep -v -F -- "# $1"
}
boot() {  # TAG ENV CODE RID: the @reboot line that starts this again, where cron is
  if ! command -v crontab > /dev/null 2>&1; then echo "BOOT none"; return 0; fi
  [ "$0" = "$dir/supervisor_start.sh" ] || cp "$0" "$dir/supervisor_start.sh" || return 0
  { unboot "$1"
    echo "@reboot sh $dir/supervisor_start.sh start $dir $2 $3 $4 > /dev/null 2>&1 # $1"
  } | crontab - 2>/dev/null && echo "BOOT cron" || echo "BOOT none"
}
case $mode in
  forget)
    tag=$3
    if command -v crontab > /dev/null 2>&1 && crontab -l 2>/dev/null | grep -q -F -- "# $tag"; then
      unboot "$tag" | crontab -
    fi
    ;;
  start)
    env=$3 code=$4 rid=$5
    boot "vmrun-supervisor:$rid" "$env" "$code" "$rid"
    if alive; then echo "RUNNING $p"; exit 0; fi
    rm -f "$dir/pid"  # an earlier one's, gone: the new one writes its own
    secrets=${VMRUN_SUPERVISOR_SECRETS:-}
    unset VMRUN_SUPERVISOR_SECRETS
    if [ -n "$secrets" ]; then
      (umask 077 && printf '%s\n' "$secrets" > "$dir/secrets.env") || exit 1
    fi
    cd "$dir/project" || exit 1
    VMRUN_CONFIG=$dir/config.toml PYTHONPATH=$HOME/$code NO_COLOR=1 \
      setsid -f "$HOME/$env/bin/python" -m vmrun supervise "$rid" --state "$dir" \
      < /dev/null >> "$dir/log" 2>&1
    i=0
    while [ ! -s "$dir/pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
    if alive; then echo "STARTED $p"; exit 0; fi
    tail -n 5 "$dir/log" 2>/dev/null
    exit 3
    ;;
  stop)
    if ! alive; then echo GONE; exit 0; fi
    kill -TERM "$p" 2>/dev/null
    i=0
    while alive && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    alive && kill -KILL "$p" 2>/dev/null
    echo STOPPED
    ;;
  *) echo "supervisor_start.sh: unknown mode $mode" >&2; exit 2 ;;
esac
