#!/bin/sh
# STAND-IN for systemctl on a test host (tests/testbed/services.py): no init system runs in
# a network namespace, so this starts, stops and reports the units `vmrun setup --slurm`
# uses, with the argv and user of their Debian unit files (munge.service, slurmctld.service,
# slurmd.service, slurmdbd.service, mariadb.service), each in the background with its pid in
# a file, and stops each by that pid. Anything else is refused (exit 1), so an unexpected
# call shows in a test.
set -u
dir=/run/vmrun-standin
mkdir -p "$dir"

unit_argv() {  # the unit's ExecStart, run in the foreground (Type=simple, or munged -F)
  case $1 in
    munge) echo "/usr/bin/setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged --foreground" ;;
    slurmctld) echo "/usr/sbin/slurmctld -D -s" ;;
    slurmd) echo "/usr/sbin/slurmd -D -s" ;;
    slurmdbd) echo "/usr/sbin/slurmdbd -D -s" ;;
    mariadb) echo "/usr/bin/setpriv --reuid=mysql --regid=mysql --init-groups /usr/sbin/mariadbd" ;;
    *) return 1 ;;
  esac
}

pid_of() { cat "$dir/$1.pid" 2>/dev/null; }
running() { p=$(pid_of "$1") && [ -n "$p" ] && kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ]; }

start() {
  running "$1" && return 0
  argv=$(unit_argv "$1") || { echo "STAND-IN systemctl: unknown unit $1" >&2; return 5; }
  if [ "$1" = munge ]; then  # RuntimeDirectory=munge
    install -d -o munge -g munge -m 0755 /run/munge
  fi
  if [ "$1" = mariadb ]; then  # its ExecStartPre
    install -d -o mysql -g root -m 0755 /run/mysqld
  fi
  # shellcheck disable=SC2086  # the unit's argv, a word each
  setsid $argv >>"$dir/$1.log" 2>&1 </dev/null &
  echo $! >"$dir/$1.pid"
  case $1 in  # Type=forking (munged), Type=notify (mariadbd): start returns once it answers
    munge) socket=/run/munge/munge.socket.2 ;;
    mariadb) socket=/run/mysqld/mysqld.sock ;;
    *) return 0 ;;
  esac
  i=0
  while [ $i -lt 300 ] && ! [ -S "$socket" ]; do sleep 0.05; i=$((i + 1)); done
  [ -S "$socket" ] || { echo "STAND-IN systemctl: $1 did not start" >&2; return 1; }
}

stop() {
  running "$1" || { rm -f "$dir/$1.pid"; return 0; }
  p=$(pid_of "$1")
  kill -TERM "$p" 2>/dev/null
  i=0
  while [ $i -lt 200 ] && running "$1"; do sleep 0.05; i=$((i + 1)); done
  running "$1" && kill -KILL "$p" 2>/dev/null
  rm -f "$dir/$1.pid"
}

verb=${1:-}
[ $# -gt 0 ] && shift
now=0 quiet=0 units=""
for a in "$@"; do
  case $a in
    --now) now=1 ;;
    --quiet | -q) quiet=1 ;;
    --no-block | --no-pager) ;;
    -*) echo "STAND-IN systemctl: unsupported option $a" >&2; exit 1 ;;
    *) units="$units ${a%.service}" ;;
  esac
done
rc=0
case $verb in
  daemon-reload) ;;
  start) for u in $units; do start "$u" || rc=1; done ;;
  stop) for u in $units; do stop "$u"; done ;;
  restart) for u in $units; do stop "$u"; start "$u" || rc=1; done ;;
  reload) for u in $units; do running "$u" && kill -HUP "$(pid_of "$u")"; done ;;
  enable)
    for u in $units; do
      touch "$dir/$u.enabled"
      [ $now = 1 ] && { start "$u" || rc=1; }
    done ;;
  disable)
    for u in $units; do
      rm -f "$dir/$u.enabled"
      [ $now = 1 ] && stop "$u"
    done ;;
  is-active)
    for u in $units; do
      if running "$u"; then [ $quiet = 1 ] || echo active; else [ $quiet = 1 ] || echo inactive; rc=3; fi
    done ;;
  is-enabled)
    for u in $units; do
      if [ -e "$dir/$u.enabled" ]; then [ $quiet = 1 ] || echo enabled; else [ $quiet = 1 ] || echo disabled; rc=1; fi
    done ;;
  *) echo "STAND-IN systemctl: unsupported command $verb" >&2; exit 1 ;;
esac
exit $rc
