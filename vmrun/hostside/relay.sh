# sh relay.sh ACTION STATE TAG [ARG...] (vmrun.transfer.relay): the host-to-host hop, on
# either host. STATE is the relay folder relative to the home (.vmrun/relay); TAG names one
# transfer (vmrun-relay-<unix time>-<hex>): its folder STATE/TAG and the comment of its
# authorized_keys line (and DEST/.TAG, the staging folder of an older vmrun's hop).
#   key STATE TAG KNOWN ADDR < PRIVATE    sender: the key (0600) and a known_hosts of one
#                                         line, in a 0700 folder; prints the address this
#                                         host sends from to ADDR (empty if unknown)
#   list STATE TAG < "name\0..."          sender: what to send (relative to the source)
#   send STATE TAG SRC USER ADDR PORT WAIT
#                                         sender: the list as records (transfer_pack.py)
#                                         | ssh to the receiver; progress lines on stderr;
#                                         3: a file could not be read; 126: no python3
#   results STATE TAG                     sender: what the receiver said of each file
#   grant STATE TAG < "LINE\nDEST"        receiver: DEST recorded; LINE appended to
#                                         ~/.ssh/authorized_keys (a new file renamed over
#                                         the old one, its mode kept)
#   receive STATE TAG                     receiver: the forced command of that line: the
#                                         records verified and placed under DEST
#                                         (transfer_recv.py)
#   mkdirs STATE TAG DEST < "dir\0..."    receiver: the directories under DEST
#   revoke STATE TAG AGE                  either: TAG's line, folder and staging gone; with
#                                         TAG empty every vmrun-relay one at least AGE
#                                         seconds old. Prints "removed N".
umask 077
act=$1 rel=$2 tag=$3 lib=${0%/*}
state=$HOME/$rel
shift 3
d=$state/$tag

dest_of() {  # the receiver's destination as grant recorded it, every byte kept
  r=$(cat -- "$1/dest" && echo x) || return 1
  printf %s "${r%x}"
}

keys_file() {  # ~/.ssh/authorized_keys, through a symlink to the file it names
  k=$HOME/.ssh/authorized_keys
  if [ -L "$k" ]; then k=$(readlink -f -- "$k"); fi
  printf %s "$k"
}

lk=$HOME/.ssh/.vmrun-relay.lock
lock() {  # one rewrite of authorized_keys at a time; after 10 s the lock counts as stale
  i=0
  while ! mkdir -- "$lk" 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -ge 100 ]; then rm -rf -- "$lk"; mkdir -- "$lk" 2>/dev/null; break; fi
    sleep 0.1
  done
}

case $act in
key)
  mkdir -p -- "$d" && chmod 700 -- "$d" || exit 1
  cat >"$d/key" || exit 1
  printf '%s\n' "$1" >"$d/known_hosts" || exit 1
  if command -v ip >/dev/null 2>&1; then
    ip -o route get "$2" 2>/dev/null | sed -n 's/.* src \([^ ]*\).*/\1/p' | head -n 1
  fi
  ;;
list)
  cat >"$d/list"
  ;;
send)
  src=$1 user=$2 addr=$3 port=$4 wait=$5
  command -v ssh >/dev/null 2>&1 || { echo "vmrun-relay: no ssh client on this host" >&2; exit 127; }
  # shellcheck disable=SC2088  # ssh expands the ~ itself (a home with spaces stays whole)
  set -- -F /dev/null -i "$d/key" -o IdentitiesOnly=yes -o BatchMode=yes \
    -o StrictHostKeyChecking=yes -o "UserKnownHostsFile=~/$rel/$tag/known_hosts" \
    -o GlobalKnownHostsFile=/dev/null -o UpdateHostKeys=no -o ConnectTimeout="$wait" \
    -o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o Compression=no -o LogLevel=ERROR \
    -o ControlMaster=no -o ControlPath=none -T -p "$port" -l "$user"
  # AES-GCM where this client has it (the receiver's sshd picks from the list)
  if ssh -Q cipher 2>/dev/null | grep -qx 'aes128-gcm@openssh.com'; then
    set -- "$@" -o Ciphers=aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr
  fi
  command -v python3 >/dev/null 2>&1 || { echo "vmrun-relay: no python3 on this host" >&2; exit 126; }
  # records: each file verified (SHA-256) and placed on the receiver as it arrives; its
  # answers (`+NAME` / `-NAME WHY`, NUL-separated) kept for `results`
  { python3 "$lib/transfer_pack.py" "$src" "$d/list"; echo $? >"$d/pack.rc"; } |
    ssh "$@" -- "$addr" vmrun-relay >"$d/results"
  st=$?
  [ "$st" -eq 0 ] || exit "$st"
  [ "$(cat -- "$d/pack.rc" 2>/dev/null)" = 0 ] || exit 3
  ;;
results)
  cat -- "$d/results"
  ;;
grant)
  mkdir -p -- "$d" && chmod 700 -- "$d" || exit 1
  IFS= read -r line || exit 1
  cat >"$d/dest" || exit 1
  mkdir -p -- "$HOME/.ssh" || exit 1
  ak=$(keys_file)
  new=$ak.$tag
  lock
  if [ -e "$ak" ]; then cp -p -- "$ak" "$new"; else : >"$new"; fi &&
    if [ -s "$new" ] && [ -n "$(tail -c 1 -- "$new")" ]; then printf '\n' >>"$new"; fi &&
    printf '%s\n' "$line" >>"$new" && mv -f -- "$new" "$ak"
  r=$?
  rmdir -- "$lk" 2>/dev/null
  exit "$r"
  ;;
receive)
  [ -f "$d/dest" ] || { echo "vmrun-relay: no transfer $tag on this host" >&2; exit 1; }
  dest=$(dest_of "$d") || exit 1
  command -v python3 >/dev/null 2>&1 || { echo "vmrun-relay: no python3 on this host" >&2; exit 126; }
  mkdir -p -- "$dest" || exit 1
  exec python3 "$lib/transfer_recv.py" "$dest"
  ;;
mkdirs)
  mkdir -p -- "$1" && cd -- "$1" && xargs -0 -r mkdir -p --
  ;;
revoke)
  age=$1 now=$(date +%s) n=0
  ak=$(keys_file)
  if [ -f "$ak" ]; then
    lock
    new=$ak.vmrun-revoke-$$
    if cp -p -- "$ak" "$new"; then
      # shellcheck disable=SC2016  # awk's own $NF
      if awk -v tag="$tag" -v now="$now" -v age="$age" '
          { c = $NF; hit = 0
            if (c ~ /^vmrun-relay-[0-9]+-[0-9a-f]+$/) {
              if (tag != "") hit = (c == tag)
              else { split(c, p, "-"); hit = (now - p[3] >= age) }
            }
            if (hit) { dropped++; next }
            print }
          END { print dropped + 0 > "/dev/stderr"; exit (dropped ? 0 : 1) }' \
          "$ak" >"$new" 2>"$new.n"; then
        n=$(cat -- "$new.n") && mv -f -- "$new" "$ak"
      else rm -f -- "$new"
      fi
      rm -f -- "$new.n"
    fi
    rmdir -- "$lk" 2>/dev/null
  fi
  for f in "$state"/vmrun-relay-*; do
    [ -d "$f" ] || continue
    name=${f##*/}
    if [ -n "$tag" ]; then [ "$name" = "$tag" ] || continue
    else
      t=${name#vmrun-relay-}; t=${t%%-*}
      case $t in ''|*[!0-9]*) continue ;; esac
      [ $((now - t)) -ge "$age" ] || continue
    fi
    if [ -f "$f/dest" ]; then
      dest=$(dest_of "$f") && (cd -- "$dest" 2>/dev/null && rm -rf -- "./.$name")
    fi
    rm -rf -- "$f" && n=$((n + 1))
  done
  echo "removed $n"
  ;;
*)
  echo "relay.sh: unknown action $act" >&2; exit 2
  ;;
esac
