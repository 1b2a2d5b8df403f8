#!/bin/sh
# One host of a Slurm cluster that vmrun makes of SSH hosts (vmrun.queue).
#   slurm_node.sh facts NAME [ADDR]  what the host is: KEY=VALUE lines, changes nothing
#                              (ADDR: its address for the others, where vmrun knows it)
#   slurm_node.sh key NAME     the cluster's munge key, base64 (the controller's, to reuse)
#   slurm_node.sh install NAME the distribution's packages, where missing (apt-get)
#   slurm_node.sh apply NAME   make the host a node (and, with VMRUN_SLURM_CTLD=1, the
#                              controller; with VMRUN_SLURM_DBD=1 too, its slurmdbd and
#                              MariaDB); what to write comes in the environment (stdin)
#   slurm_node.sh remove NAME  stop and remove what apply made; packages stay
#   slurm_node.sh shared NAME DIR [TOKEN]  with TOKEN: make DIR and leave TOKEN in it (the
#                              controller); without: print the token this host sees there
# Root comes from `sudo -n` unless the user is root. Files are written only when their text
# differs (a second apply changes nothing), each to a new name and then moved over the old.
# One `FAIL why` line and exit 1 when the host cannot be made a node.
set -u
mode=$1
name=$2
mark="# vmrun-cluster: $name"
state=/var/lib/slurm/vmrun-$name
conf=/etc/slurm/slurm.conf

fail() { echo "FAIL $*"; exit 1; }
# the key comes in the environment (from stdin): kept in a variable of this shell only, never
# handed to the commands it runs (apt-get's scripts...); its temp file goes at any exit
key_b64=${VMRUN_MUNGE_KEY:-}
unset VMRUN_MUNGE_KEY
tmp=""
trap 'rm -f "$tmp"' EXIT
if [ "$(id -u)" = 0 ]; then
  as_root() { "$@"; }
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null </dev/null; then
  as_root() { sudo -n "$@"; }
else
  [ "$mode" = facts ] || fail "needs root: run as root or allow this user passwordless sudo"
  as_root() { return 1; }
fi

ours() {  # is the host's slurm.conf this cluster's? (its first lines carry the mark)
  [ -f "$conf" ] && head -n 3 "$conf" | grep -qxF "$mark"
}

active() { as_root systemctl is-active --quiet "$1"; }

# put PATH MODE OWNER: $text to PATH when it differs; says CHANGED PATH when it did
put() {
  tmp=$(mktemp) || fail "mktemp failed"
  printf '%s' "$text" >"$tmp"
  if as_root cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 0; fi
  if ! { as_root install -m "$2" -o "${3%:*}" -g "${3#*:}" "$tmp" "$1.vmrun-new" &&
    as_root mv -f "$1.vmrun-new" "$1"; }; then rm -f "$tmp"; fail "could not write $1"; fi
  rm -f "$tmp"
  echo "CHANGED $1"
}

# the /etc/hosts lines between this cluster's marks, first in the file: a lookup takes the
# first line that names a host, and the nodes' names must be the addresses they reach each
# other at, not the host's own line for itself (Debian's `127.0.1.1 HOSTNAME`, a public
# address); a new file moved over the old, or, where /etc/hosts is a mount point a rename
# cannot replace (a container's), written in place
hosts_block() {
  tmp=$(mktemp) || fail "mktemp failed"
  if [ -n "$1" ]; then printf '%s begin\n%s\n%s end\n' "$mark" "$1" "$mark" >"$tmp"; fi
  awk -v b="$mark begin" -v e="$mark end" '$0 == b {skip = 1} !skip {print} $0 == e {skip = 0}' \
    /etc/hosts >>"$tmp"
  if ! cmp -s "$tmp" /etc/hosts; then
    if ! { as_root install -m 0644 "$tmp" /etc/hosts.vmrun-new &&
      as_root mv -f /etc/hosts.vmrun-new /etc/hosts 2>/dev/null; }; then
      as_root rm -f /etc/hosts.vmrun-new
      # shellcheck disable=SC2016  # $1 is the inner shell's
      as_root sh -c 'cat "$1" >/etc/hosts' sh "$tmp" || fail "could not write /etc/hosts"
    fi
    echo "CHANGED /etc/hosts"
  fi
  rm -f "$tmp"
}

# service UNIT CHANGED: start it (and at boot) unless it runs; restart it when its files changed
service() {
  if ! active "$1"; then
    as_root systemctl enable --now "$1" >/dev/null 2>&1 || fail "systemctl could not start $1: $(why "$1")"
    echo "SERVICE $1 started"
  elif [ "$2" = 1 ]; then
    as_root systemctl restart "$1" >/dev/null 2>&1 || fail "systemctl could not restart $1: $(why "$1")"
    echo "SERVICE $1 restarted"
  else
    echo "SERVICE $1 running"
  fi
}

why() {  # a unit's state and its journal's last lines, on one line
  printf '%s; %s' "$(as_root systemctl is-active "$1" 2>&1)" \
    "$(as_root journalctl -u "$1" -n 3 --no-pager -q 2>/dev/null | tr '\n' ' ')"
}

facts() {  # [ADDR]
  echo "hostname=$(hostname -s 2>/dev/null || hostname)"
  # the address given (a cloud's private one), else the one this SSH session arrived at
  # (the private one, through a jump host too)
  given=${1:-}
  # shellcheck disable=SC2086  # SSH_CONNECTION's four words
  set -- ${SSH_CONNECTION:-}
  echo "addr=${given:-${3:-$(hostname -I 2>/dev/null | cut -d' ' -f1)}}"
  [ -d /run/systemd/system ] && echo "systemd=1"
  for tool in munged slurmd slurmctld sinfo slurmdbd mariadbd; do
    command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] && echo "has_$tool=1"
  done
  command -v apt-get >/dev/null 2>&1 && echo "apt=1"
  if command -v dpkg-query >/dev/null 2>&1; then
    echo "versions=$(dpkg-query -W -f '${Package} ${Version},' slurmd slurmctld munge 2>/dev/null)"
  fi
  echo "cpus=$(nproc --all 2>/dev/null)"
  echo "mem_mb=$(awk '/^MemTotal:/ {print int($2 / 1024)}' /proc/meminfo 2>/dev/null)"
  slurmd=$(command -v slurmd || echo /usr/sbin/slurmd)
  [ -x "$slurmd" ] && echo "slurmd_c=$("$slurmd" -C 2>/dev/null | head -n 1)"
  # the GPUs' names only from an nvidia-smi that works ("No devices were found" is no GPU)
  if names=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null); then
    echo "gpu_names=$(printf '%s\n' "$names" | tr '\n' ',')"
  fi
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then echo "cgroup=v2"
  elif [ -d /sys/fs/cgroup/cpuset ]; then echo "cgroup=v1"
  else echo "cgroup=none"; fi
  id slurm >/dev/null 2>&1 && echo "slurm_user=1"
  [ -d /etc/slurm-llnl ] && ! [ -d /etc/slurm ] && echo "conf_dir=/etc/slurm-llnl"
  if ours; then echo "conf=ours"
  elif [ -f "$conf" ]; then echo "conf=other $(grep -m1 -o '^# vmrun-cluster: .*' "$conf" | cut -d' ' -f3)"
  else echo "conf=none"; fi
  if [ "$(id -u)" = 0 ]; then echo "root=root"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null </dev/null; then echo "root=sudo"
  else echo "root=none"; fi
}

# the distribution's packages, installed once; offline hosts must have them already
install_packages() {
  need=""
  for pair in munged:munge slurmd:slurmd sinfo:slurm-client; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need="$need ${pair#*:}"
  done
  if [ "${VMRUN_SLURM_CTLD:-0}" = 1 ]; then
    command -v slurmctld >/dev/null 2>&1 || [ -x /usr/sbin/slurmctld ] || need="$need slurmctld"
  fi
  if [ "${VMRUN_SLURM_DBD:-0}" = 1 ]; then
    for pair in slurmdbd:slurmdbd mariadbd:mariadb-server; do
      command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need="$need ${pair#*:}"
    done
  fi
  [ -n "$need" ] || return 0
  command -v apt-get >/dev/null 2>&1 || fail "packages$need are missing and there is no apt-get: install them"
  # a fresh image's package lists may be empty, and its first boot's upgrades hold dpkg's lock
  apt="apt-get -q -o DPkg::Lock::Timeout=600"
  # shellcheck disable=SC2086  # apt-get's words, the package names, a word each
  said=$(as_root env DEBIAN_FRONTEND=noninteractive $apt update 2>&1 &&
    as_root env DEBIAN_FRONTEND=noninteractive $apt install -y --no-install-recommends $need 2>&1) ||
    fail "packages$need are missing and apt-get could not install them (offline?): $(printf '%s\n' "$said" | tail -n 1)"
  echo "INSTALLED$need"
}

apply() {
  [ -d /run/systemd/system ] || fail "systemd does not run this host's services: start munge and slurmd by hand, or use a VM with systemd"
  if [ -f "$conf" ] && ! ours; then
    fail "$conf is not vmrun's (another Slurm is configured here): remove it or leave this host out"
  fi
  install_packages
  if ! [ -f "$state/name" ]; then  # the first apply: the host's own munge, to put back
    as_root install -d -m 0755 "$state" || fail "could not make $state"
    if as_root test -f /etc/munge/munge.key; then  # /etc/munge is munge's, 0700
      as_root cp -p /etc/munge/munge.key "$state/munge.key.before"
      if active munge; then as_root touch "$state/munge.was-active"; fi
    fi
    echo "$name" | as_root tee "$state/name" >/dev/null
  fi
  key_changed=0
  tmp=$(mktemp) || fail "mktemp failed"  # 0600: the key is never in a file others can read
  printf '%s' "$key_b64" | base64 -d >"$tmp"
  if ! as_root cmp -s "$tmp" /etc/munge/munge.key; then
    if ! { as_root install -m 0400 -o munge -g munge "$tmp" /etc/munge/munge.key.vmrun-new &&
      as_root mv -f /etc/munge/munge.key.vmrun-new /etc/munge/munge.key; }; then
      rm -f "$tmp"; fail "could not write the munge key"
    fi
    key_changed=1
    echo "CHANGED /etc/munge/munge.key"
  fi
  rm -f "$tmp"
  conf_changed=0
  for file in slurm.conf gres.conf cgroup.conf; do
    case $file in
      slurm.conf) text=$VMRUN_SLURM_CONF ;;
      gres.conf) text=$VMRUN_SLURM_GRES ;;
      cgroup.conf) text=$VMRUN_SLURM_CGROUP ;;
    esac
    said=$(put "/etc/slurm/$file" 0644 root:root) || { echo "$said"; exit 1; }
    [ -n "$said" ] && { echo "$said"; conf_changed=1; }
  done
  hosts_block "${VMRUN_SLURM_HOSTS:-}"
  owner=root
  id slurm >/dev/null 2>&1 && owner=slurm
  if ! { as_root install -d -o "$owner" -g "$owner" -m 0755 "$state/ctld" "$state/log" &&
    as_root install -d -m 0755 "$state/spool"; }; then fail "could not make Slurm's folders under $state"; fi
  service munge "$key_changed"
  if [ "${VMRUN_SLURM_DBD:-0}" = 1 ]; then accounting "$owner"; fi
  if [ "${VMRUN_SLURM_CTLD:-0}" = 1 ]; then
    service slurmctld "$conf_changed"
  elif active slurmctld; then  # the controller moved away from this host
    as_root systemctl disable --now slurmctld >/dev/null 2>&1
    echo "SERVICE slurmctld stopped"
  fi
  service slurmd "$conf_changed"
}

# accounting OWNER: slurmdbd with its database in the host's MariaDB (started if it was not,
# and stopped again on removal). The database user's password is made here once and kept
# in slurmdbd.conf (0600, Slurm's user): it never leaves the host, and goes to MariaDB on
# stdin, never in a command line. Then the cluster is registered, as slurmctld needs.
dbconf=/etc/slurm/slurmdbd.conf
accounting() {
  db=$(printf '%s' "$name" | tr '-' '_')
  if ! [ -f "$state/mariadb.before" ]; then
    if active mariadb; then echo active; else echo inactive; fi | as_root tee "$state/mariadb.before" >/dev/null
  fi
  service mariadb 0
  i=0
  until printf 'SELECT 1;\n' | as_root mariadb >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -lt 150 ] || fail "MariaDB does not answer: $(why mariadb)"
    sleep 0.2
  done
  pass=$(as_root sed -n 's/^StoragePass=//p' "$dbconf" 2>/dev/null | head -n 1)
  [ -n "$pass" ] || pass=$(head -c 64 /dev/urandom | base64 | tr -dc 'A-Za-z0-9' | head -c 32)
  user="slurm_$db"
  printf "CREATE DATABASE IF NOT EXISTS \`slurm_acct_%s\`;
CREATE USER IF NOT EXISTS '%s'@'localhost' IDENTIFIED BY '%s';
ALTER USER '%s'@'localhost' IDENTIFIED BY '%s';
GRANT ALL ON \`slurm_acct_%s\`.* TO '%s'@'localhost';\n" \
    "$db" "$user" "$pass" "$user" "$pass" "$db" "$user" | as_root mariadb ||
    fail "could not make the accounting database in MariaDB"
  text="${VMRUN_SLURMDBD_CONF}StoragePass=$pass
"
  said=$(put "$dbconf" 0600 "$1:$1") || { echo "$said"; exit 1; }
  changed=0
  [ -n "$said" ] && { echo "CHANGED $dbconf"; changed=1; }
  service slurmdbd "$changed"
  i=0
  until sacctmgr -n -P show cluster format=cluster >/dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -lt 150 ] || fail "slurmdbd does not answer: $(why slurmdbd); see $state/log/slurmdbd.log"
    sleep 0.2
  done
  if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qxF "$name"; then
    as_root sacctmgr -i add cluster "$name" >/dev/null 2>&1 || fail "sacctmgr could not add cluster $name"
    echo "CHANGED accounting: cluster $name"
  fi
}

# slurmdbd and the accounting database gone; MariaDB stopped again where vmrun started it
no_accounting() {
  as_root head -n 1 "$dbconf" 2>/dev/null | grep -qxF "$mark" || return 0  # 0600: Slurm's
  db=$(printf '%s' "$name" | tr '-' '_')
  if active slurmdbd; then as_root systemctl disable --now slurmdbd >/dev/null 2>&1; echo "STOPPED slurmdbd"; fi
  if active mariadb; then
    printf "DROP DATABASE IF EXISTS \`slurm_acct_%s\`;\nDROP USER IF EXISTS 'slurm_%s'@'localhost';\n" \
      "$db" "$db" | as_root mariadb >/dev/null 2>&1 && echo "REMOVED database slurm_acct_$db"
    if [ "$(cat "$state/mariadb.before" 2>/dev/null)" = inactive ]; then
      as_root systemctl disable --now mariadb >/dev/null 2>&1
      echo "STOPPED mariadb"
    fi
  fi
  as_root rm -f "$dbconf"
}

remove() {
  if ! [ -d "$state" ]; then echo "GONE"; return 0; fi
  for unit in slurmd slurmctld; do
    if active "$unit"; then as_root systemctl disable --now "$unit" >/dev/null 2>&1; echo "STOPPED $unit"; fi
  done
  no_accounting
  if ours; then
    for file in slurm.conf gres.conf cgroup.conf; do as_root rm -f "/etc/slurm/$file"; done
    echo "REMOVED /etc/slurm"
  fi
  hosts_block ""
  if [ -f "$state/munge.key.before" ]; then
    as_root mv -f "$state/munge.key.before" /etc/munge/munge.key
  else
    as_root rm -f /etc/munge/munge.key
  fi
  if [ -e "$state/munge.was-active" ]; then
    as_root systemctl restart munge >/dev/null 2>&1
  elif active munge; then
    as_root systemctl disable --now munge >/dev/null 2>&1
    echo "STOPPED munge"
  fi
  as_root rm -rf "$state"
  echo "KEPT $(dpkg-query -W -f '${Package} ' slurmd slurmctld slurm-client munge slurmdbd \
    mariadb-server 2>/dev/null)"
}

case $mode in
  facts) facts "${3:-}" ;;
  key)
    ours || fail "this host is not the controller of cluster $name"
    as_root base64 -w0 /etc/munge/munge.key || fail "could not read the munge key"
    echo ;;
  install) install_packages ;;
  apply) apply ;;
  remove) remove ;;
  shared)
    check="$3/.vmrun-shared-$name"
    if [ $# -gt 3 ]; then
      if ! { mkdir -p "$3" && printf '%s\n' "$4" >"$check"; }; then
        fail "could not write in $3 (it must be the user's to write)"
      fi
    else
      cat "$check" 2>/dev/null || echo "none"
    fi ;;
  *) fail "unknown mode $mode" ;;
esac
