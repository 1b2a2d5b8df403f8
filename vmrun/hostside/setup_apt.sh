# Shell functions every apply script can call (playbooks/default.yaml's header lists them).
# They are sourced (`.`) by a step's apply script and run in its shell, so their settings come
# from its environment, as everything a step gets does: VMRUN_APT_LOCK_WAIT (seconds),
# VMRUN_APT_LOCK_FILES, VMRUN_SUDO, VMRUN_SETUP_RUN and VMRUN_APT_MARK (the file that says
# which setup run last ran `apt-get update`; from vmrun.remote_paths). POSIX sh, so they work
# in the step's bash and under shellcheck; each body is a subshell, so its variables stay its own.
#
# The lock holder comes from /proc/locks, which lists every POSIX lock as PID MAJ:MIN:INODE and
# which any user can read: fuser and lsof cannot see root's processes without root.
vmrun_apt_holders() (
  # shellcheck disable=SC2086 # the lock files are a word list on purpose
  for f in ${VMRUN_APT_LOCK_FILES:-/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock \
    /var/lib/apt/lists/lock /var/cache/apt/archives/lock}; do
    devino=$(stat -c '%d %i' "$f" 2>/dev/null) || continue
    dev=${devino% *} ino=${devino#* }
    key=$(printf '%02x:%02x:%s' $(((dev >> 8) & 0xfff)) \
      $(((dev & 0xff) | ((dev >> 12) & 0xfff00))) "$ino")
    awk -v k="$key" '$2 != "->" && $6 == k { print $5 }' /proc/locks
  done | sort -u | while read -r pid; do
    if [ "$pid" -gt 0 ] 2>/dev/null; then
      cmd=$(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline | cut -c1-60 | sed 's/ *$//')
      printf 'pid %s (%s)\n' "$pid" "$cmd"
    else
      echo "a process vmrun cannot name (an open file description lock)"
    fi
  done
  return 0
)
vmrun_apt_wait() (
  limit=${VMRUN_APT_LOCK_WAIT:-300} start=$(date +%s) said=""
  while holders=$(vmrun_apt_holders | awk 'NR > 1 { printf "; " } { printf "%s", $0 }')
    [ -n "$holders" ]; do
    if [ $(($(date +%s) - start)) -ge "$limit" ]; then
      echo "the apt/dpkg lock is still held after ${limit} s, by $holders" >&2
      echo "on a fresh cloud VM that is usually unattended-upgrades: let it finish" \
        "(or stop it) and re-run; --param apt_lock_wait=SECONDS waits longer" >&2
      return 1
    fi
    if [ "$holders" != "$said" ]; then
      echo "waiting up to ${limit} s for the apt/dpkg lock, held by $holders" >&2
      said=$holders
    fi
    sleep 1
  done
)
vmrun_apt_get() (
  vmrun_apt_wait
  # shellcheck disable=SC2086 # VMRUN_SUDO is `sudo -n` or empty: words on purpose
  ${VMRUN_SUDO:-} apt-get -o DPkg::Lock::Timeout="${VMRUN_APT_LOCK_WAIT:-300}" "$@"
)
vmrun_apt_update() (
  if [ "$(cat "$VMRUN_APT_MARK" 2>/dev/null)" = "$VMRUN_SETUP_RUN" ]; then return 0; fi
  vmrun_apt_get update
  mkdir -p "$(dirname "$VMRUN_APT_MARK")" && printf '%s' "$VMRUN_SETUP_RUN" >"$VMRUN_APT_MARK"
)
vmrun_apt_install() (
  vmrun_apt_update
  vmrun_apt_get install -y "$@"
)
# vmrun_apt_repo NAME KEY_URL LINE: a third-party apt repository (Docker's, NVIDIA's). Its key,
# ASCII-armored as both publish it (apt reads a .asc keyring as it is: no gpg needed), goes to
# $VMRUN_APT_KEYRINGS/NAME.asc; LINE ("deb URL SUITE [COMPONENT...]") to
# $VMRUN_APT_SOURCES/NAME.list, signed by that key only; then `apt-get update` even when it ran
# earlier in this setup run: the new repository's lists are what the install needs.
vmrun_apt_repo() (
  keyring=${VMRUN_APT_KEYRINGS:-/etc/apt/keyrings}/$1.asc
  sources=${VMRUN_APT_SOURCES:-/etc/apt/sources.list.d}/$1.list
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  vmrun_fetch "$2" "$tmp/key"
  printf '%s\n' "$3" | sed "s#^deb #deb [signed-by=$keyring] #" >"$tmp/list"
  # shellcheck disable=SC2086 # VMRUN_SUDO is `sudo -n` or empty: words on purpose
  ${VMRUN_SUDO:-} install -D -m 0644 "$tmp/key" "$keyring"
  # shellcheck disable=SC2086
  ${VMRUN_SUDO:-} install -D -m 0644 "$tmp/list" "$sources"
  echo "apt repository $1: $(cat "$tmp/list")" >&2
  vmrun_apt_get update
  mkdir -p "$(dirname "$VMRUN_APT_MARK")" && printf '%s' "$VMRUN_SETUP_RUN" >"$VMRUN_APT_MARK"
)
