# What the autostop watchdog is doing, in one round trip:
#   sh -c SOURCE vmrun-autostop-status CONF STATE SCRIPT    (paths relative to the home)
# NOW <the host's clock>, INSTALLED 0|1 (CONF is there), STATE <its one line, TAB-separated
# key=value, as autostop_watch.sh writes it>, ALIVE 0|1 (its pid runs SCRIPT), BOOT cron|
# systemd|none (what starts it at boot).
conf=$1 state=$2 script=$3
cd "$HOME" || exit 1
echo "NOW $(date +%s)"
if [ -f "$conf" ]; then echo "INSTALLED 1"; else echo "INSTALLED 0"; fi
s=
if [ -f "$state" ]; then
  IFS= read -r s < "$state" || [ -n "$s" ] || { sleep 0.1; IFS= read -r s < "$state"; }
fi
echo "STATE $s"
pid=$(cat "$state.pid" 2>/dev/null)
alive=0
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
   && [ "$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n 2p)" = "$HOME/$script" ]; then
  alive=1
fi
echo "ALIVE $alive"
if [ -f "/etc/systemd/system/vmrun-autostop-$(id -un).service" ]; then echo "BOOT systemd"
elif crontab -l 2>/dev/null | grep -qF '# vmrun autostop'; then echo "BOOT cron"
else echo "BOOT none"; fi
