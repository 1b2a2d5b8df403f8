# Install the autostop watchdog (autostop_watch.sh), or check that it can be:
#   sh autostop_install.sh MODE CONF STATE SCRIPT WATCH
# with CONF_TEXT and WORD in $VMRUN_AUTOSTOP_CONF and $VMRUN_AUTOSTOP_WORD (they come by stdin,
# in the command wrapper's environment header: the power-off command may hold a secret, so
# it is never on a command line, and CONF is the user's alone, 0600); the warning's
# notify.json (its webhooks) in $VMRUN_AUTOSTOP_NOTIFY, written beside CONF (0600).
# MODE power: can this user power the machine off (WORD: the power-off command's first word,
#   "" for the default `sudo -n shutdown -h now`, which needs passwordless sudo unless root)?
# MODE check: that, and can the watchdog start at boot (a systemd unit where systemd runs and
#   sudo works, else a crontab @reboot line)? Both print `OK <boot>` or one `FAIL <why>` line
#   (exit 3), and change nothing.
# MODE install: the checks, then SCRIPT (a copy of WATCH, the installed autostop_watch.sh:
#   the watchdog outlives this vmrun's version) and CONF (CONF_TEXT plus this shell's
#   PATH, so the watchdog finds what a login finds, also at boot) where they differ, the boot
#   entry where missing, and the watchdog started unless it runs already: a changed CONF is
#   read at its next tick, a changed SCRIPT restarts it. Prints `SCRIPT|CONF same|new`,
#   `BOOT <how> present|added`, `PID <pid> running|started|restarted`: installing twice
#   changes nothing. Paths are relative to the home.
mode=$1 conf=$2 state=$3 script=$4 src=$5
text=${VMRUN_AUTOSTOP_CONF-} word=${VMRUN_AUTOSTOP_WORD-} told=${VMRUN_AUTOSTOP_NOTIFY-}
unset VMRUN_AUTOSTOP_CONF VMRUN_AUTOSTOP_WORD VMRUN_AUTOSTOP_NOTIFY
cd "$HOME" || exit 1
path=$PATH
PATH=$PATH:/usr/local/sbin:/usr/sbin:/sbin
tag='# vmrun autostop'
fail() { echo "FAIL $*"; exit 3; }
sudo=
if [ "$(id -u)" != 0 ]; then sudo='sudo -n'; fi

if [ -z "$word" ] && [ -n "$sudo" ]; then
  needs="powering off (shutdown -h now) needs root: allow this user passwordless sudo, or set"
  needs="$needs autostop_command"
  command -v sudo > /dev/null 2>&1 || fail "there is no sudo, and $needs"
  said=$(sudo -n true 2>&1 < /dev/null) \
    || fail "sudo needs a password ($(printf '%s\n' "$said" | head -n 1)), and $needs"
elif [ -n "$word" ] && ! command -v "$word" > /dev/null 2>&1; then
  fail "the power-off command $word is not on this host's PATH"
fi
[ "$mode" != power ] || { echo "OK"; exit 0; }
command -v setsid > /dev/null 2>&1 || fail "setsid (util-linux) is missing"
user=$(id -un)
unit=vmrun-autostop-$user.service
if [ -d /run/systemd/system ] && command -v systemctl > /dev/null 2>&1 \
   && { [ -z "$sudo" ] || sudo -n true > /dev/null 2>&1 < /dev/null; }; then
  boot=systemd
elif command -v crontab > /dev/null 2>&1; then
  boot=cron
else
  fail "nothing here would start the watchdog at boot: no systemd (with sudo) and no crontab" \
    "(sudo apt-get install cron)"
fi
[ "$mode" != check ] || { echo "OK $boot"; exit 0; }

mkdir -p "${script%/*}" "${conf%/*}" || fail "cannot create ${script%/*}"
changed=
cat -- "$src" > "$script.new" || fail "cannot write $script"
if cmp -s "$script.new" "$script"; then
  rm -f "$script.new"; echo "SCRIPT same"
else
  mv -f "$script.new" "$script"; changed=1; echo "SCRIPT new"
fi
case $path in *"'"*) path= ;; esac
rm -f "$conf.new"
(umask 077 && printf "%s\npath='%s'\n" "$text" "$path" > "$conf.new") || fail "cannot write $conf"
if cmp -s "$conf.new" "$conf"; then
  rm -f "$conf.new"; echo "CONF same"
else
  mv -f "$conf.new" "$conf"; echo "CONF new"
fi
chmod 600 "$conf" || fail "cannot make $conf the user's alone (chmod 600)"
# the warning's notification (VMRUN_AUTOSTOP_NOTIFY: its notify.json, 0600) and its sender,
# copied like SCRIPT so that the watchdog outlives this vmrun's version; none: removed
notify=${conf%/*}/autostop-notify
if [ -n "$told" ]; then
  if ! { (umask 077 && mkdir -p "$notify" && printf '%s\n' "$told" > "$notify/notify.json") \
    && cat -- "${src%/*}/notify_send.py" > "$notify/notify_send.py"; }; then
    fail "cannot write $notify"
  fi
else
  rm -rf "$notify"
fi

if [ "$boot" = cron ]; then
  line="@reboot /bin/sh \"\$HOME/$script\" $conf >/dev/null 2>&1 $tag"
  cur=$(crontab -l 2>/dev/null)
  if printf '%s\n' "$cur" | grep -qxF -e "$line"; then
    echo "BOOT cron present"
  else
    { if [ -n "$cur" ]; then printf '%s\n' "$cur" | grep -vF -e "$tag"; fi
      printf '%s\n' "$line"; } | crontab - || fail "crontab could not add the @reboot line"
    echo "BOOT cron added"
  fi
else
  body="[Unit]
Description=vmrun autostop watchdog ($user)
After=network.target

[Service]
User=$user
WorkingDirectory=$HOME
ExecStart=/bin/sh \"$HOME/$script\" $conf
Restart=on-failure
RestartSec=10

[Install]
WantedBy=multi-user.target"
  file=/etc/systemd/system/$unit
  if printf '%s\n' "$body" | cmp -s - "$file"; then
    echo "BOOT systemd present"
  else
    if ! { printf '%s\n' "$body" | $sudo tee "$file" > /dev/null && $sudo systemctl daemon-reload \
           && $sudo systemctl enable "$unit" > /dev/null 2>&1; }; then
      fail "systemctl could not enable $unit"
    fi
    echo "BOOT systemd added"
  fi
fi

pid=
running() {  # the pid file names a live process running SCRIPT (`sh SCRIPT CONF`)
  pid=$(cat "$state.pid" 2>/dev/null)
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
    && [ "$(tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | sed -n 2p)" = "$HOME/$script" ]
}
how=started
if running; then
  [ -n "$changed" ] || { echo "PID $pid running"; exit 0; }
  how=restarted  # a new script: this one goes (TERM is a clean stop, also for systemd)
  kill -TERM -"$pid" 2>/dev/null || kill -TERM "$pid"
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  kill -KILL -"$pid" 2>/dev/null
fi
rm -f "$state.pid"
if [ "$boot" = systemd ]; then
  $sudo systemctl restart "$unit" || fail "systemctl could not start $unit"
else
  setsid -f /bin/sh "$HOME/$script" "$conf" < /dev/null > /dev/null 2>&1
fi
i=0
until running || [ $i -ge 100 ]; do sleep 0.1; i=$((i + 1)); done
running || fail "the watchdog did not start: see the end of $(sed -n "s/^log=//p" "$conf")"
echo "PID $pid $how"
