# sh store_copy.sh MODE SRC DEST [PYTHON [EXCLUDE]] (vmrun.stores.mover): a bucket's objects
# under SRC (bucket/prefix) copied into DEST (relative to the home unless absolute) by
# rclone, straight from the bucket. MODE: copy, or dry (say what would be copied); EXCLUDE:
# an rclone filter of keys left out (a run's record, `/.vmrun/**`), or empty.
# VMRUN_STORE_CONFIG, which vmrun's command wrapper sets from its stdin, is rclone's config
# of one remote named `store` (it may hold credentials): written to a 0600 file under
# ~/.vmrun/tmp, unset, and the file removed in every ending; never an argument. The mover:
# store_tool.sh's rclone (PYTHON's env's, ~/.vmrun/bin's, PATH's; 1.63 or later).
# Exit 5: no such rclone ("tool VERSION" said); 6: DEST cannot be made or written;
# 7: too little room ("nospace FREE_KIB NEEDED_KIB"); 8: nothing under SRC ("empty");
# else rclone's own status, its JSON log lines on stdout as they come.
mode=$1 src=$2 dest=$3 py=${4:-} exclude=${5:-}
# vmrun-inline: store_tool.sh
if ! store_tool "$py"; then
  echo "tool ${_st_version:-none}"
  exit 5
fi
# shellcheck disable=SC2154  # store_tool.sh's, inlined above
rclone=$_st_rclone
mkdir -p "$HOME/.vmrun/tmp" || exit 1
old=$(umask)
umask 077
cfg=$(mktemp "$HOME/.vmrun/tmp/store.XXXXXX") || exit 1
trap 'rm -f "$cfg"' EXIT
trap 'rm -f "$cfg"; exit 130' INT
trap 'rm -f "$cfg"; exit 143' TERM HUP
printf '%s' "${VMRUN_STORE_CONFIG:-}" >"$cfg" || exit 1
unset VMRUN_STORE_CONFIG
umask "$old"
where=$dest  # the folder, or (a dry run makes nothing) its nearest existing parent
if [ "$mode" = dry ]; then
  while [ ! -d "$where" ] && [ "$where" != . ] && [ "$where" != / ]; do
    where=$(dirname -- "$where")
  done
elif ! mkdir -p -- "$dest" 2>/dev/null; then
  where=""
fi
if [ -z "$where" ] || [ ! -w "$where" ] || [ ! -d "$where" ]; then
  echo nowrite
  exit 6
fi
# the objects' total against the free space (what is there already counts as room)
size=$("$rclone" --config "$cfg" size --json "store:$src" ${exclude:+--exclude "$exclude"} --retries 1 --low-level-retries 2 \
  --contimeout 10s 2>&1) || {
  printf '%s\n' "$size"
  exit 3
}
count=$(printf '%s' "$size" | sed -n 's/.*"count":\([0-9]*\).*/\1/p')
bytes=$(printf '%s' "$size" | sed -n 's/.*"bytes":\([0-9]*\).*/\1/p')
if [ "${count:-0}" -eq 0 ]; then
  echo empty
  exit 8
fi
printf 'total %s %s\n' "$count" "$bytes"
free=$(df -Pk -- "$where" 2>/dev/null | awk 'NR == 2 { print $4 }')
have=$(du -sk -- "$dest" 2>/dev/null | awk '{ print $1 }')
have=${have:-0}
needed=$(((bytes + 1023) / 1024))
case $free$have in
  *[!0-9]* | '') ;;
  *)
    if [ "$((free + have))" -lt "$needed" ]; then
      echo "nospace $free $needed"
      exit 7
    fi
    ;;
esac
dry=""
if [ "$mode" = dry ]; then dry=--dry-run; fi
# --checksum: unchanged is the same size and MD5 (the ETag, or rclone's md5chksum), not a
# time; every object is checked on arrival and renamed into place only when whole
"$rclone" --config "$cfg" copy "store:$src" "$dest" ${dry:+"$dry"} ${exclude:+--exclude "$exclude"} --checksum --use-json-log -v \
  --stats 1s --stats-log-level NOTICE --retries 3 --low-level-retries 10 \
  --transfers 8 --checkers 16 2>&1
