# Remove the autostop watchdog completely, and check that nothing of it is left:
#   sh -c SOURCE vmrun-autostop-cancel CONF STATE LOG LIB NAME   (paths relative to the home;
#   the script is LIB/NAME, given in two parts so that this command line never names it)
# CONF goes first (a watchdog that wakes up without it stops), then the systemd unit or the
# crontab @reboot line, then every process running the script (TERM to its process group,
# KILL after 5 s), then the files. Prints UNIT/CRON/FILES removed, KILLED <pids>, and LEFT
# <what> for anything that survived (exit 1); nothing at all when it was not installed.
conf=$1 state=$2 log=$3 script=$4/$5
cd "$HOME" || exit 1
tag='# vmrun autostop'
sudo=
if [ "$(id -u)" != 0 ]; then sudo='sudo -n'; fi
left=
rm -f "$conf" "$conf.new"
rm -rf "${conf%/*}/autostop-notify"  # the warning's notification and its secrets
unit=/etc/systemd/system/vmrun-autostop-$(id -un).service
if [ -f "$unit" ]; then
  $sudo systemctl disable --now "${unit##*/}" > /dev/null 2>&1
  $sudo rm -f "$unit" && $sudo systemctl daemon-reload
  if [ -f "$unit" ]; then left="$left, $unit (sudo failed)"; else echo "UNIT removed"; fi
fi
cur=$(crontab -l 2>/dev/null)
case $cur in
  *"$tag"*)
    rest=$(printf '%s\n' "$cur" | grep -vF -e "$tag")
    if [ -n "$rest" ]; then printf '%s\n' "$rest" | crontab -; else crontab -r; fi
    if crontab -l 2>/dev/null | grep -qF -e "$tag"; then left="$left, the crontab line"
    else echo "CRON removed"; fi ;;
esac

# a pattern, not the path itself, so that grep's own command line never matches it
pattern="\\(.*/\\)*$(printf '%s' "$script" | sed 's/[.]/\\./g')"
watchdog() {  # $1: a pid whose command line is `sh SCRIPT ...` (not `vi SCRIPT`, say)
  tr '\0' '\n' < "/proc/$1/cmdline" 2>/dev/null | {
    read -r shell && read -r first || exit 1
    case $shell in *sh) ;; *) exit 1 ;; esac
    case $first in "$HOME/$script" | "$script") ;; *) exit 1 ;; esac
  }
}
watchdogs() {  # every process running the script
  grep -lsxz -e "$pattern" /proc/[0-9]*/cmdline 2>/dev/null | while read -r f; do
    p=${f#/proc/}; p=${p%/cmdline}
    if [ "$p" != $$ ] && watchdog "$p"; then echo "$p"; fi
  done
}
pids=$(watchdogs)
if [ -n "$pids" ]; then
  for p in $pids; do kill -TERM -"$p" 2>/dev/null || kill -TERM "$p" 2>/dev/null; done
  i=0
  while [ -n "$(watchdogs)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  for p in $(watchdogs); do kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; done
  sleep 0.1
  still=$(watchdogs)
  if [ -n "$still" ]; then left="$left, process $(echo "$still" | tr '\n' ' ')"; fi
  echo "KILLED $(echo "$pids" | tr '\n' ' ')"
fi
found=
for f in "$script" "$state" "$state".* "$log" "$log.1"; do
  if [ -e "$f" ]; then found=1; rm -f "$f"; fi
done
if [ -n "$found" ]; then echo "FILES removed"; fi
if [ -n "$left" ]; then echo "LEFT ${left#, }"; exit 1; fi
