# The autostop watchdog (`vmrun autostop`, vmrun.autostop): powers the machine off once it has
# been idle for a period, with nothing running on vmrun's side. Two ways to run it:
#   sh ~/.vmrun/lib/autostop_watch.sh CONF   the watchdog: one long-lived process per user,
#       started by vmrun and at boot (cron @reboot, or a systemd unit); CONF holds the shell
#       assignments vmrun.autostop.settings writes, read again every tick (no restart needed)
#   sh -c SOURCE vmrun-autostop now WHY   `vmrun train --down-after-run`: power off now
#       unless a vmrun run or another vmrun command is alive or a process that is no vmrun
#       run's holds a GPU; prints BUSY/BLOCKED/UNSURE (exit 3) or the command's output and
#       `RAN <exit status>`. CONF's text comes in $VMRUN_AUTOSTOP_CONF (by stdin: the
#       power-off command may hold a secret, so it is never on a command line nor logged)
# Idle, at a tick (docs/autostop.md):
#  1. no vmrun run alive: no record in $runs/*/ whose pid is a live process that started when
#     its pid_start says (run_start.sh writes both), and none started since the last tick;
#  2. no vmrun command alive (a marker $active/PID, written by command_wrapper.sh or
#     command_mark.sh, whose PID runs with the start time the marker holds; a stale marker
#     is removed), none started since the last tick, and none ended since ($active/.ended);
#  3. every GPU under $threshold % (nvidia-smi; a host without nvidia-smi or a driver has none);
#  4. sessions=active: no login session (`who`) whose terminal had input within the period;
#     any: no login session at all; ignore: sessions are not looked at.
# A GPU compute process without $run_env in its environment (not a vmrun run's, or another
# user's: unreadable) blocks powering off whatever else holds, and says so.
# Cost: this one sh. Per tick at most one nvidia-smi (the devices query; after a tick whose
# GPUs were all idle, the compute-processes query instead), one `who`, one `grep` (only while
# processes hold a GPU) and one `sleep`; `date` and `wall` only when a decision changes. The
# clock is the boot time plus /proc/uptime, read with builtins. The log has one line per
# decision change and is kept under 256 KiB (one older file beside it).
# Files: $state (one line, TAB-separated key=value: what vmrun shows), $state.pid, .lock (one
# watchdog per user: flock), .m0/.m1 (tick marks: runs started since), .tmp; $log. Read (and
# stale markers removed): $active/PID, $active/.ended.

# A budget (CONF's `budget`, seconds; 0: none; `vmrun up --max-cost` sets it per VM from the
# price): the machine's running time is added up in $state.spent at every tick (kept across
# power-offs and boots); once it reaches the budget, every vmrun run alive is stopped with its
# work saved (budget_watch.py beside this file: SIGUSR2 to its ranks, their epoch's snapshot)
# and the machine powers off as soon as none is left (5 minutes at most), idle or not.
# period 0: no idle power-off (a budget alone).
# CONF sets period interval warn (seconds), threshold (%), sessions, poweroff (shell text; empty:
# shutdown), nvsmi, nvpath, run_env, runs, active, state, log, path, notify (a folder with the
# warning's notify.json and notify_send.py; empty: the warning is not sent anywhere else).
# shellcheck disable=SC2154,SC1090
tab=$(printf '\t')

set_path() {  # the PATH the installer had (~/.vmrun/bin first), also under cron or systemd
  PATH=${path:-$PATH}:/usr/local/sbin:/usr/sbin:/sbin:$nvpath
  export PATH
  tmp=$state.tmp
  # shellcheck disable=SC2088  # a literal `~/` from vmrun.toml, expanded here
  case $nvsmi in "~/"*) smi=$HOME/${nvsmi#??} ;; *) smi=$nvsmi ;; esac
  cmd=$poweroff
  if [ -z "$cmd" ]; then
    if [ "$uid" = 0 ]; then cmd='shutdown -h now'; else cmd='sudo -n shutdown -h now'; fi
  fi
}

setup_clock() {
  btime=0
  while read -r k v; do
    if [ "$k" = btime ]; then btime=$v; break; fi
  done < /proc/stat
  uid=$(id -u)
  read -r host < /proc/sys/kernel/hostname
}

clock() { read -r up _ < /proc/uptime; now=$((btime + ${up%.*})); }

say() {  # a line in the log, when a decision changes
  line="$(date '+%Y-%m-%d %H:%M:%S' 9>&-) $*"
  printf '%s\n' "$line" >> "$log"
  logged=$((logged + ${#line} + 1))
  if [ "$logged" -gt 262144 ]; then mv -f "$log" "$log.1" 9>&-; logged=0; fi
}

hm() { date -d "@$1" '+%H:%M' 9>&-; }

# alive_run REC: a run's record; its agent (the same process) still runs
# vmrun-inline: run_alive.sh

runs() {  # found: the runs alive, or started since the tick that wrote $mark
  found=
  for d in "$runs"/*/; do
    d=${d%/}
    [ -f "$d/pid" ] || continue
    # shellcheck disable=SC3013  # -nt: dash, bash and busybox sh have it
    if [ -n "$mark" ] && [ -f "$mark" ] && ! [ "$mark" -nt "$d/pid" ]; then
      :  # started since the last tick (it may have ended already)
    elif [ -e "$d/exit_code" ] || [ -e "$d/stopped" ] || ! alive_run "$d"; then
      continue
    fi
    found="$found ${d##*/}"
  done
}

commands() {  # cmds: vmrun's own commands alive, or started or ended since $mark's tick
  cmds=0 cmd_pids=
  [ -n "$active" ] || return 0
  for f in "$active"/[0-9]*; do
    [ -f "$f" ] || continue
    p=${f##*/} s='' l=''
    case $p in *[!0-9]*) continue ;; esac
    [ "$p" != "$own" ] || continue
    # shellcheck disable=SC3013
    if [ -n "$mark" ] && [ -f "$mark" ] && ! [ "$mark" -nt "$f" ]; then
      cmds=$((cmds + 1)) cmd_pids="$cmd_pids $p"; continue  # started since the last tick
    fi
    read -r s 2>/dev/null < "$f"
    if [ -z "$s" ] && [ -z "$mark" ]; then
      cmds=$((cmds + 1)) cmd_pids="$cmd_pids $p"; continue  # being written
    fi
    if [ -n "$s" ] && read -r l 2>/dev/null < "/proc/$p/stat"; then
      # shellcheck disable=SC2086  # the fields after the command name, split on purpose
      set -- ${l##*) }
      if [ "${20}" = "$s" ]; then cmds=$((cmds + 1)) cmd_pids="$cmd_pids $p"; continue; fi
    fi
    rm -f "$f" 9>&-  # stale: its command died without removing it (or the host rebooted)
  done
  # shellcheck disable=SC3013
  if [ "$cmds" = 0 ] && [ -n "$mark" ] && [ -f "$mark" ] && [ -f "$active/.ended" ] \
     && ! [ "$mark" -nt "$active/.ended" ]; then
    cmds=1  # one ended since the last tick
  fi
}

apps() {  # foreign: pids on a GPU without $run_env in their environment ($tmp: one per line)
  set --
  while read -r p; do
    case $p in '' | *[!0-9]*) continue ;; esac
    if [ -d "/proc/$p" ]; then set -- "$@" "/proc/$p/environ"; fi
  done < "$tmp"
  foreign=
  [ $# -gt 0 ] || return 0
  grep -lsz "^$run_env=" "$@" > "$tmp.own" 9>&-
  for f in "$@"; do
    own=
    while read -r o; do
      if [ "$o" = "$f" ]; then own=1; fi
    done < "$tmp.own"
    if [ -z "$own" ]; then p=${f#/proc/}; foreign="$foreign ${p%/environ}"; fi
  done
}

gpus() {  # gpu_busy, gpu_err, gpu_none; foreign and apps_at after a processes query
  gpu_err='' gpu_none=''
  if ! command -v "$smi" > /dev/null 2>&1; then gpu_none=1 gpu_busy='' foreign=''; return; fi
  query=--query-gpu=index,utilization.gpu
  if [ "$ask" = apps ]; then query=--query-compute-apps=pid; fi
  "$smi" "$query" --format=csv,noheader,nounits > "$tmp" 2>&1 < /dev/null 9>&-
  rc=$?
  case $rc in
    0) ;;
    6 | 9 | 12 | 126 | 127) gpu_none=1 gpu_busy='' foreign=''; return ;;  # no driver or GPU
    *) gpu_err="nvidia-smi failed (exit $rc)"; return ;;
  esac
  if [ "$ask" = apps ]; then
    apps; apps_at=$now ask=gpu
    return
  fi
  gpu_busy=
  while IFS=", " read -r i u; do
    case $u in '' | *[!0-9]*) continue ;; esac  # [N/A], [Not Supported]
    if [ "$u" -ge "$threshold" ]; then gpu_busy="$gpu_busy, GPU $i $u%"; fi
  done < "$tmp"
  gpu_busy=${gpu_busy#, }
  if [ -z "$gpu_busy" ]; then ask=apps; fi  # idle: who holds them, next tick
}

count_sessions() {  # sessions_n: the login sessions that keep the machine up
  sessions_n=0
  [ "$sessions" != ignore ] || return 0
  LC_ALL=C who -u > "$tmp" 2>/dev/null 9>&- || return 0
  seen=; if [ -d /proc/1 ]; then seen=1; fi  # hidepid: others' processes are hidden
  while read -r _n _l rest; do
    # the login time's date is one word or two (locales differ), its HH:MM then idle, pid
    # shellcheck disable=SC2086  # words, on purpose
    set -- $rest
    while [ $# -gt 0 ]; do
      case $1 in *:*) shift; break ;; esac
      shift
    done
    idle=${1-} pid=${2-}
    case $pid in
      '' | *[!0-9]*) ;;
      *) if [ -n "$seen" ] && ! [ -d "/proc/$pid" ]; then continue; fi ;;  # a stale entry
    esac
    if [ "$sessions" = active ]; then
      case $idle in
        old) continue ;;
        *:*)
          h=${idle%:*} m=${idle#*:}
          if [ $(((${h#0} * 60 + ${m#0}) * 60)) -ge "$period" ]; then continue; fi ;;
      esac
    fi
    sessions_n=$((sessions_n + 1))
  done < "$tmp"
}

power_off() {  # $1: why
  say "powering off: $1"
  (eval "$cmd") >> "$log" 2>&1 < /dev/null 9>&-
  rc=$?
  if [ "$rc" = 0 ]; then
    note="power-off command ran at $now"
    say "the power-off command ran (exit 0)"
  else
    note="power-off command failed (exit $rc) at $now"
    say "the power-off command failed (exit $rc; its output is above): trying again after another period"
  fi
}

budget() {  # spent: the running time so far; at the budget, the runs stopped, then off
  [ "${budget:-0}" -gt 0 ] || return 0
  spent=0
  read -r spent 2>/dev/null < "$state.spent" 9>&-
  case $spent in '' | *[!0-9]*) spent=0 ;; esac
  spent=$((spent + now - ${ticked:-$now}))
  ticked=$now
  echo "$spent" > "$state.spent" 9>&-
  [ "$spent" -ge "$budget" ] || return 0
  if [ -z "$spent_at" ]; then
    spent_at=$now
    say "its budget of $budget s running time is spent (--max-cost): stopping the runs, then powering off"
    wall "vmrun: $host has run its budget (--max-cost): its runs save and stop, then it powers off." \
      < /dev/null > /dev/null 2>&1 9>&-
    for r in $found; do
      if command -v python3 > /dev/null 2>&1 && [ -s "$runs/$r/pid" ]; then
        (exec setsid python3 "$lib/budget_watch.py" "$runs/$r" "$(cat "$runs/$r/pid")" 0 \
          "the machine's budget") < /dev/null > /dev/null 2>&1 9>&- &
      fi
    done
  fi
  if [ -n "$budget_off" ] && [ "$now" -lt $((budget_off + 300)) ]; then return 0; fi
  if [ -z "$found" ] || [ "$now" -ge $((spent_at + 300)) ]; then
    power_off "its budget of $budget s running time is spent (--max-cost)"
    budget_off=$now  # again in 5 minutes if the machine is still up
  fi
}

decide() {  # awake, block, since, off: the rule above, and what follows from it
  awake=
  for r in $found; do awake="$awake, run $r"; done
  if [ "$cmds" = 1 ]; then awake="$awake, a vmrun command"; fi
  if [ "$cmds" -gt 1 ]; then awake="$awake, $cmds vmrun commands"; fi
  if [ -n "$gpu_busy" ]; then awake="$awake, $gpu_busy"; fi
  if [ -n "$gpu_err" ]; then awake="$awake, $gpu_err"; fi
  if [ "$sessions_n" = 1 ]; then awake="$awake, 1 login session"; fi
  if [ "$sessions_n" -gt 1 ]; then awake="$awake, $sessions_n login sessions"; fi
  awake=${awake#, }
  block=
  if [ -n "$foreign" ]; then block="non-vmrun GPU process pid$foreign"; fi
  if [ -n "$awake" ]; then since='' warned=''; else since=${since:-$now}; fi
  off=
  [ -n "$since" ] && [ "$period" -gt 0 ] || return 0
  off=$((since + period))
  # powering off needs a look at the GPUs' processes since the machine went idle
  if [ -n "$block" ] || { [ -z "$gpu_none" ] && [ "${apps_at:-0}" -lt "$since" ]; }; then
    return 0
  fi
  w=$warn
  if [ "$w" -gt "$period" ]; then w=$period; fi
  if [ "$now" -ge "$off" ]; then
    power_off "idle since $(hm "$since")"
    since=$now warned=''
    off=$((since + period))
  elif [ "$w" -gt 0 ] && [ -z "$warned" ] && [ "$now" -ge $((off - w)) ]; then
    warned=1
    msg="vmrun autostop: $host has been idle since $(hm "$since") and powers off at $(hm "$off")."
    msg="$msg To keep it up: start a vmrun run, or \`vmrun autostop --cancel\`"
    if [ "$sessions" = active ]; then msg="$msg, or type in your terminal"; fi
    wall "$msg." < /dev/null > /dev/null 2>&1 9>&-
    say "warned logged-in users (wall): powering off at $(hm "$off")"
    if [ -n "${notify:-}" ] && [ -r "$notify/notify.json" ] && command -v python3 > /dev/null 2>&1
    then  # the user, wherever they are (notify_send.py: a few bounded tries, in the background)
      rm -rf "$notify"/notified.*
      python3 "$notify/notify_send.py" "$notify" send autostop "" "off=$(hm "$off")" \
        "since=$(hm "$since")" < /dev/null >> "$log" 2>&1 9>&- &
    fi
  fi
}

report() {  # the state line, and a log line when the decision changed
  st="pid=$$${tab}period=$period${tab}interval=$interval${tab}since=$since${tab}off=$off"
  st="$st${tab}awake=$awake${tab}block=$block${tab}note=$note"
  if [ "$st" != "$last_st" ]; then printf '%s\n' "$st" > "$state"; last_st=$st; fi
  key="$found|$cmds|${gpu_busy:+gpu}|$gpu_err|$sessions_n|$block|${since:+idle}"
  [ "$key" != "$last_key" ] || return 0
  last_key=$key
  if [ -n "$block" ]; then
    say "never powering off while a process that is no vmrun run's holds a GPU: $block"
  elif [ -n "$awake" ]; then
    say "awake: $awake"
  else
    gpu="every GPU under $threshold %"
    if [ -n "$gpu_none" ]; then gpu="no GPU"; fi
    when="powers off at $(hm "${off:-$now}")"
    if [ "$period" -eq 0 ]; then when="no idle power-off"; fi
    say "idle: no vmrun run, $gpu, no login session that counts ($sessions): $when"
  fi
}

tick() {
  clock
  mark=$state.m$(((n + 1) % 2))
  if [ "$n" = 0 ]; then mark=; fi
  echo "$now" > "$state.m$((n % 2))"
  n=$((n + 1))
  runs
  budget
  commands
  gpus
  count_sessions
  decide
  report
}

watch() {  # $1: CONF, relative to the home
  conf=$1
  cd "$HOME" || exit 1
  [ -f "$conf" ] || exit 0
  # a session of its own: `vmrun autostop --cancel` stops this shell and its child together
  read -r l < "/proc/$$/stat"
  # shellcheck disable=SC2086
  set -- ${l##*) }
  if [ "$4" != "$$" ]; then exec setsid /bin/sh "$0" "$conf"; fi
  umask 077  # the log holds the power-off command's output
  setup_clock
  . "./$conf"
  set_path
  chmod 600 "$log" "$log.1" 2>/dev/null  # written by an older watchdog, maybe readable by all
  exec 9>> "$state.lock"
  if command -v flock > /dev/null 2>&1 && ! flock -n 9; then exit 0; fi  # one is running
  echo $$ > "$state.pid"
  logged=$(wc -c 2>/dev/null < "$log" 9>&-)
  logged=${logged:-0} n=0 ask=gpu since='' warned='' note='' last_st='' last_key='' apps_at=''
  foreign='' own='' ticked='' spent_at='' budget_off=''
  lib=${0%/*}
  say "started (pid $$): powers off after ${period} s idle (0: never), after ${budget:-0} s running in all (0: no budget); checks every ${interval} s"
  while [ -f "$conf" ]; do
    . "./$conf"
    set_path
    tick
    sleep "$interval" 9>&-
  done
  say "stopped: $conf was removed"
  rm -f "$state" "$state.pid" "$state.m0" "$state.m1" "$state.tmp" "$state.tmp.own" 9>&-
}

power_off_now() {  # $1: why; the settings (CONF's text) in $VMRUN_AUTOSTOP_CONF
  cd "$HOME" || exit 1
  umask 077
  # no settings, no power-off (without them the command would be the default shutdown)
  [ -n "${VMRUN_AUTOSTOP_CONF-}" ] || { echo "UNSURE no settings came with the command"; exit 3; }
  eval "$VMRUN_AUTOSTOP_CONF"
  unset VMRUN_AUTOSTOP_CONF VMRUN_AUTOSTOP_WORD
  chmod 600 "$log" "$log.1" 2>/dev/null
  why=$1
  setup_clock
  set_path
  clock
  logged=0 mark='' ask=apps foreign='' own=$PPID  # the wrapper of this very command
  runs
  if [ -n "$found" ]; then echo "BUSY run$found is still running"; exit 3; fi
  commands
  if [ "$cmds" -gt 0 ]; then echo "BUSY vmrun command pid$cmd_pids is still running"; exit 3; fi
  gpus
  if [ -n "$foreign" ]; then echo "BLOCKED non-vmrun GPU process pid$foreign holds a GPU"; exit 3; fi
  if [ -n "$gpu_err" ]; then echo "UNSURE $gpu_err: cannot tell who holds the GPUs"; exit 3; fi
  rm -f "$tmp" "$tmp.own"
  say "powering off now ($why)"
  wall "vmrun: $host powers off now: $why." < /dev/null > /dev/null 2>&1
  (eval "$cmd") 2>&1 < /dev/null
  rc=$?
  say "the power-off command ran (exit $rc)"
  echo "RAN $rc"
}

case ${1-} in
  now) shift; power_off_now "$@" ;;
  *) watch "$@" ;;
esac
