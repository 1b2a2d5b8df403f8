# A run's copy to its bucket (`train --store`, vmrun.stores.sync), on every node of the run:
# each sends what its own ranks wrote under the run's one prefix; the master (ROLE record)
# sends the run's record too and claims the attempt, the others (ROLE outputs) follow it:
#   sh store_sync.sh check DEST [PYTHON [PROBE]]     before the run: the mover is here and
#     the bucket takes a write (DEST/.vmrun/PROBE: the master's `started`, each other node
#     its own `started.N`, since two nodes writing one object fail the mover's read-back);
#     exit 5 "tool VERSION" without the mover, 3 with its words when refused or unreachable
#   sh store_sync.sh start REC [PYTHON]     the run's agent (store_copier.py), once: the
#     mover found, the config written to a 0600 file in REC; prints the config's path, the
#     mover's and the python's, one a line (exit 5 without the mover)
#   sh store_sync.sh pass REC OUT DEST URL SINCE CFG RCLONE ROLE PYTHON ID END     one round
#     of the copy (store_copier.py's loop in the run's agent runs one every few seconds; END
#     1 once the run has ended); prints the seconds until the next, or `stop` when the copy
#     is over (done, replaced, given up: its work files gone). What a pass leaves for the
#     next is in REC/.store.state. ROLE: record or outputs; ID: the attempt's id, the same
#     in every node's launch spec
# DEST: bucket/prefix/RUN_ID as rclone names it after its remote; URL: the same as shown
# (s3://...); OUT: the run's output folder; SINCE: empty when OUT is the run's own folder,
# else the run's first start (epoch seconds): only files changed since then are the run's.
# VMRUN_STORE_CONFIG (from vmrun's command wrapper, never an argument): rclone's config of
# one remote, `store`; it may hold credentials, so it lives only in a 0600 file that the
# agent removes in every ending.
# The copier: every few seconds, the files of OUT whose status changed since the last copy
# that went through (a renamed snapshot counts when it is renamed: its ctime) go to DEST,
# never a temporary name (.NAME.tmp-*, *.partial, *.tmp: DCP's .metadata.tmp), nothing under
# a hidden folder, no hidden file but in a checkpoint's folder (DCP's .metadata: a .env in
# a work directory stays). A checkpoint's .metadata goes last: only once the bucket holds
# every file it names at the size it needs (rclone lsjson of its folder, against
# checkpoint_layout.py lacks), so the bucket never holds one that points at missing shards;
# until then it waits, said once in the run's log with what it waits for (store.json:
# waits), and the run's end waits for it as for a failed copy. Every node sends a file it
# never sent itself check-first (--immutable --checksum): one the bucket holds with other
# bytes (another node's) is never overwritten, said once in the log and in store.json
# (conflicts), and left out from then on. A node that copies outputs only tags what it
# sends with the attempt's id (object metadata vmrun-attempt), and the master sends over a
# clash without this attempt's tag (an earlier attempt's file) as before. The record's files (log, run.json,
# provenance, exit_code) to DEST/.vmrun every 30 s, with outputs and in the round after
# (the log's line about a snapshot goes with it), and at the end. A copy that fails is tried
# again (backing off to 15 s) and said once in the run's log, as is catching up; it never
# touches the run. REC/store.json says where it stands (`vmrun status`). After the run ends:
# one last copy of everything changed, then it is over; it gives up 30 min after the end if the
# bucket stays out of reach (said in the log, the files stay on the host).
# Fencing: each attempt is a generation (REC/attempt: run_start.sh numbers a resume past
# both the record's attempts and the generation a record restored from the bucket saw),
# claimed in DEST/.vmrun/generation before its first copy, unless the bucket already holds
# one as new (then this attempt is a replaced one). The copier reads it back whenever the
# record is due (with every copy of outputs, every 30 s, before its last pass); once a newer
# attempt has claimed the run (a node that was replaced and came back), this attempt is
# stopped (run_stop.sh, `replaced`) and copies nothing more, its last pass included. A
# generation that cannot be read is a failed round, never taken as none: the copy waits.
# The record's own copy of it (a restore brings one) is never sent back. With ID, the
# master writes it to DEST/.vmrun/generation.id before the generation; a node that copies
# outputs only never writes either: it sends nothing until the bucket's id is its attempt's
# (store.json: waiting; said once after a minute), and once another id follows there, its
# attempt was replaced: its run is stopped (`replaced`) and nothing more is sent from it.
# vmrun-inline: store_tool.sh
mode=$1
shift
conf_file() {  # $1: the folder; the config from the environment in a new 0600 file there
  mkdir -p "$1" || return 1
  _old=$(umask)
  umask 077
  _cfg=$(mktemp "$1/store.XXXXXX") || return 1
  printf '%s' "${VMRUN_STORE_CONFIG:-}" > "$_cfg" || { rm -f "$_cfg"; return 1; }
  umask "$_old"
  unset VMRUN_STORE_CONFIG
  echo "$_cfg"
}
case $mode in
  check)
    dest=$1 py=${2:-} probe=${3:-started}
    case $probe in started | started.[0-9]*) ;; *) echo "store_sync.sh: bad probe $probe" >&2; exit 2 ;; esac
    if ! store_tool "$py"; then
      echo "tool ${_st_version:-none}"
      exit 5
    fi
    cfg=$(conf_file "$HOME/.vmrun/tmp") || exit 1
    unset VMRUN_STORE_CONFIG
    trap 'rm -f "$cfg"' EXIT
    trap 'rm -f "$cfg"; exit 130' INT
    trap 'rm -f "$cfg"; exit 143' TERM HUP
    # shellcheck disable=SC2154  # store_tool.sh's, inlined above
    date +%s | "$_st_rclone" --config "$cfg" rcat "store:$dest/.vmrun/$probe" \
      --retries 1 --low-level-retries 2 --contimeout 10s --timeout 30s 2>&1 || exit 3
    # read back too: the copier reads the run's generation there before it writes
    # shellcheck disable=SC2069  # the mover's words to check's output, the bytes nowhere
    "$_st_rclone" --config "$cfg" cat "store:$dest/.vmrun/$probe" --retries 1 \
      --low-level-retries 2 --contimeout 10s --timeout 30s 2>&1 > /dev/null || exit 3
    exit 0
    ;;
  start)
    rec=$1 py=${2:-}
    case "$rec" in /*) ;; *) rec="$HOME/$rec" ;; esac
    store_tool "$py" || exit 5
    rm -f "$rec/.store.state"  # an earlier attempt's (its agent taken over mid-way)
    cfg=$(conf_file "$rec") || exit 1
    # shellcheck disable=SC2154  # store_tool.sh's, inlined above
    printf '%s\n%s\n%s\n' "$cfg" "$_st_rclone" "${_st_py:-python3}"
    exit 0
    ;;
  pass) ;;
  *) echo "store_sync.sh: unknown mode $mode" >&2; exit 2 ;;
esac

rec=$1 out=$2 dest=$3 url=$4 since=$5 cfg=$6 rclone=$7 role=${8:-record} py=${9:-python3}
token=${10:-} end=${11:-0}
lib=${0%/*}
gen=$(cat "$rec/attempt" 2>/dev/null)
case $gen in '' | *[!0-9]*) gen=1 ;; esac
# the pace (seconds; a test sets them shorter): a look every 2 s, the record every 30 s, a
# failed copy again after 1, 2, 4... up to 15 s; 30 min after the run's end it gives up
every=${VMRUN_STORE_EVERY:-2} logs_every=${VMRUN_STORE_LOGS_EVERY:-30}
backoff_max=${VMRUN_STORE_BACKOFF:-15} final_wait=${VMRUN_STORE_FINAL_WAIT:-1800}
stage_max=67108864
tab=$(printf '\t')
# where the earlier passes left it (REC/.store.state, written by keep)
synced='' failing_since='' error='' pending_files=0 pending_bytes=0 last_logs=0 ended_at=''
moved=0 seen=0 waited_since='' claimed=0 backoff=0 first=1
if [ -f "$rec/.store.state" ]; then
  # shellcheck disable=SC1091  # this copy's own assignments, written by keep
  . "$rec/.store.state" || exit 1
  first=0
fi
touch "$rec/.store.meta" "$rec/.store.conflicts" "$rec/.store.sent" "$rec/.store.said"
keep() {  # $1: the seconds until the next pass. What the next pass goes on from, printed
  # with the pause for the agent's loop
  {
    printf "synced='%s' failing_since='%s' pending_files='%s' pending_bytes='%s' last_logs='%s'\n" \
      "$synced" "$failing_since" "$pending_files" "$pending_bytes" "$last_logs"
    printf "ended_at='%s' moved='%s' seen='%s' waited_since='%s' claimed='%s' backoff='%s'\n" \
      "$ended_at" "$moved" "$seen" "$waited_since" "$claimed" "$backoff"
    printf "error='%s'\n" "$(printf '%s' "$error" | sed "s/'/'\\\\''/g")"
  } > "$rec/.store.state.tmp" && mv "$rec/.store.state.tmp" "$rec/.store.state"
  echo "$1"
  exit 0
}
json_list() {  # $1: a file of lines; a JSON list of its first 20 (no quote or backslash)
  head -n 20 "$1" 2>/dev/null | tr -d '"\134' \
    | awk 'BEGIN { printf "[" } { printf "%s\"%s\"", (NR > 1 ? ", " : ""), $0 } END { printf "]" }'
}
state() {  # $1: the state word; store.json in one rename
  printf '{"to": "%s", "state": "%s", "at": %s, "synced": %s, "failing_since": %s, "files": %s, "bytes": %s, "error": "%s", "role": "%s", "waits": %s, "conflicts": %s}\n' \
    "$url" "$1" "$(date +%s)" "${synced:-null}" "${failing_since:-null}" "$pending_files" \
    "$pending_bytes" "$error" "$role" "$(json_list "$rec/.store.meta")" \
    "$(json_list "$rec/.store.conflicts")" > "$rec/store.json.tmp" \
    && mv "$rec/store.json.tmp" "$rec/store.json"
}
say() {  # a line in the run's log (appended: the run's own output goes on beside it)
  printf 'vmrun: %s\n' "$1" >> "$rec/log"
}
has_shard() {  # $1: a folder that holds a DCP shard (__R_N.distcp)
  for _f in "$1"/*.distcp; do [ -f "$_f" ] && return 0; done
  return 1
}
changed() {  # $1: folder, $2: mark, $3: max depth (or empty), $4: only files changed since
  # then (epoch seconds, or empty), $5: names to leave out (the record's copy of the
  # generation); NAME<TAB>SIZE lines of what changed since the mark
  # (everything without one): no temporary name, nothing under a hidden folder (.git, a
  # tool's cache), no hidden file (a .env) but in a checkpoint's folder (one with
  # .metadata or a shard: DCP's .metadata); the record: no hidden file at all
  newer=''
  [ -e "$2" ] && newer=$2
  find "$1" -mindepth 1 ${3:+-maxdepth "$3"} -name '.*' -type d -prune -o -type f \
    ${newer:+-cnewer "$newer"} ${4:+-newermt "@$4"} ! -name '*.partial' ! -name '*.tmp' \
    ! -name '*.tmp-*' ! -name pid ! -name pid_start ! -name 'notify*' ! -name 'notified*' \
    ! -name 'store.*' ! -name "${5:-.}" -printf '%P\t%s\n' 2>/dev/null \
    | while IFS="$tab" read -r _n _s; do
      case ${_n##*/} in
        .*)
          [ -n "$3" ] && continue
          _d=.
          case $_n in */*) _d=${_n%/*} ;; esac
          [ -f "$1/$_d/.metadata" ] || has_shard "$1/$_d" || continue
          ;;
      esac
      printf '%s\t%s\n' "$_n" "$_s"
    done
}
stage_from() {  # $1: the folder, $2: its list, $3: where under the stage, $4: the list of
  # the big ones. A file up to 64 MiB (a log, metrics being appended) goes from a copy
  # made first, so what is checked on arrival is what was sent; a bigger one (a snapshot,
  # renamed into place whole) goes as it is, and one still being written fails and goes
  # next round
  [ -s "$2" ] || return 0
  while IFS="$tab" read -r name size; do
    if [ "$size" -le $stage_max ] 2>/dev/null; then
      to=$stage/$3$name
      mkdir -p "${to%/*}" && cp -p "$1/$name" "$to" 2>/dev/null
    else
      printf '%s\n' "$name" >> "$4"
    fi
  done < "$2"
}
newest() {  # the generation the bucket holds (0: none yet); fails when the bucket said
  # nothing (rclone's 3 and 4 are "not found": on a bucket, a missing object may also be an
  # empty answer)
  _g=$("$rclone" --config "$cfg" cat "store:$dest/.vmrun/generation" --retries 1 \
    --low-level-retries 2 --contimeout 10s --timeout 30s 2>> "$rec/.store.err")
  case $? in 0 | 3 | 4) ;; *) return 1 ;; esac
  case $_g in '' | *[!0-9]*) echo 0 ;; *) echo "$_g" ;; esac
}
fenced() {  # 0: a newer attempt has claimed the run (this one is stopped, nothing sent);
  # 1: not; 2: the bucket could not say
  newer=$(newest) || return 2
  # newer than this one; or, before this one claimed, as new (another node numbered alike)
  if [ "$newer" -lt "$gen" ] || { [ "$newer" = "$gen" ] && [ "$claimed" = 1 ]; }; then
    return 1
  fi
  say "attempt $gen of this run was replaced by attempt $newer (its bucket says so): stopped here, and nothing more is copied from this host"
  base=${rec%/*}
  sh "${0%/*}/run_stop.sh" "${base#"$HOME"/}" "${rec##*/}" 1000 replaced > /dev/null 2>&1
  return 0
}
claim() {  # this attempt's generation in the bucket, once, before its first copy (fenced
  # has just found none as new there); its id first (generation.id: what the other nodes'
  # copiers follow)
  [ "$claimed" = 1 ] && return 0
  if [ -n "$token" ]; then
    printf '%s\n' "$token" | "$rclone" --config "$cfg" rcat "store:$dest/.vmrun/generation.id" \
      --retries 1 --low-level-retries 3 --contimeout 10s --timeout 30s 2>> "$rec/.store.err" \
      || return 1
  fi
  printf '%s\n' "$gen" | "$rclone" --config "$cfg" rcat "store:$dest/.vmrun/generation" \
    --retries 1 --low-level-retries 3 --contimeout 10s --timeout 30s 2>> "$rec/.store.err" \
    || return 1
  claimed=1
}
follows() {  # a node that copies outputs only: its master claims the attempt, with this
  # attempt's id (the launch spec's, the same on every node). 0: the bucket's id is this
  # attempt's; 1: the bucket could not say; 3: another attempt claimed the run after this
  # one had (this one was replaced: stopped, nothing more sent); 4: not claimed yet (wait)
  _t=$("$rclone" --config "$cfg" cat "store:$dest/.vmrun/generation.id" --retries 1 \
    --low-level-retries 2 --contimeout 10s --timeout 30s 2>> "$rec/.store.err")
  case $? in 0) ;; 3 | 4) _t='' ;; *) return 1 ;; esac
  if [ -n "$token" ] && [ "$_t" = "$token" ]; then seen=1 waited_since=''; return 0; fi
  if [ "$seen" = 1 ]; then
    say "attempt $gen of this run was replaced by a newer attempt (its bucket says so): stopped here, and nothing more is copied from this host"
    base=${rec%/*}
    sh "$lib/run_stop.sh" "${base#"$HOME"/}" "${rec##*/}" 1000 replaced > /dev/null 2>&1
    return 3
  fi
  return 4
}
send() {  # $1: source, $2: where in DEST, $3: a list of names in $1 (or empty: all of it),
  # $4: "immutable": a file the bucket holds with other bytes stays (an error said), so
  # the bucket is read first. A node that copies outputs only tags what it sends with the
  # attempt's id (vmrun-attempt: the master reads it on a clash, earlier)
  _tag=
  [ "$role" = outputs ] && [ -n "$token" ] && _tag=vmrun-attempt=$token
  if [ -n "${4:-}" ]; then
    # shellcheck disable=SC2086  # the tag's options, or nothing
    "$rclone" --config "$cfg" copy "$1" "store:$dest$2" ${3:+--files-from-raw "$3"} \
      ${_tag:+-M --metadata-set $_tag} --no-traverse --immutable --checksum --retries 1 \
      --low-level-retries 3 --contimeout 10s --timeout 60s --log-level ERROR 2>> "$rec/.store.err"
    return
  fi
  # shellcheck disable=SC2086  # the tag's options, or nothing
  "$rclone" --config "$cfg" copy "$1" "store:$dest$2" ${3:+--files-from-raw "$3"} \
    ${_tag:+-M --metadata-set $_tag} --no-traverse --no-check-dest --retries 1 \
    --low-level-retries 3 --contimeout 10s --timeout 60s --log-level ERROR 2>> "$rec/.store.err"
}
push() {  # $1: a list of outputs, $2: send's $4. Staged (small ones) or as they are (big)
  [ -s "$1" ] || return 0
  stage=$rec/.store.stage
  rm -rf "$stage" && mkdir -p "$stage" || return 1
  : > "$rec/.store.big"
  stage_from "$out" "$1" "" "$rec/.store.big"
  _p=0
  if [ -n "$(ls -A "$stage")" ]; then send "$stage" "" "" "$2" || _p=1; fi
  if [ -s "$rec/.store.big" ]; then send "$out" "" "$rec/.store.big" "$2" || _p=1; fi
  return $_p
}
first_push() {  # $1: outputs this node has not sent before: never over another node's
  # file with other bytes. Such a file is said once in the log and in store.json, and
  # left out from then on; the others go. The master sends again over what no other node
  # of this attempt sent (earlier)
  : > "$rec/.store.err"
  push "$1" immutable && { cut -f1 "$1" >> "$rec/.store.sent"; return 0; }
  sed -n 's/^.*ERROR : \(.*\): Source and destination exist but do not match.*$/\1/p' \
    "$rec/.store.err" > "$rec/.store.clash"
  [ -s "$rec/.store.clash" ] || return 1
  if [ "$role" = record ]; then earlier "$1" || return 1; fi
  while IFS= read -r _c; do
    grep -qxF "$_c" "$rec/.store.conflicts" && continue
    printf '%s\n' "$_c" >> "$rec/.store.conflicts"
    say "$_c: the bucket already holds it with other bytes (another node's): not overwritten, this host's copy stays here"
  done < "$rec/.store.clash"
  if grep -v 'Source and destination exist but do not match' "$rec/.store.err" \
    | grep -q 'ERROR'; then
    return 1
  fi
  cut -f1 "$1" | grep -vxF -f "$rec/.store.conflicts" >> "$rec/.store.sent"
  : > "$rec/.store.err"
}
sent_by() {  # $1: a path in DEST; the attempt id its sender tagged it with (a node that
  # copies outputs only tags what it sends; empty: the master's, or an older vmrun's)
  "$rclone" --config "$cfg" lsjson "store:$dest/$1" -M --files-only --retries 1 \
    --low-level-retries 2 --contimeout 10s --timeout 30s 2>> "$rec/.store.err" \
    | "$py" -c 'import json, sys
found = json.load(sys.stdin)
print(((found[0].get("Metadata") if found else None) or {}).get("vmrun-attempt", ""))' \
    2>> "$rec/.store.err"
}
earlier() {  # the master, $1: first_push's list. Of the clashes (.store.clash), a path
  # another node of this attempt sent (tagged with this attempt's id) stays there; any other
  # (an earlier attempt's, its master's or another node's) is sent again over it, as the
  # master always did. 1: the bucket could not say
  : > "$rec/.store.over"
  : > "$rec/.store.keep"
  while IFS= read -r _c; do
    _by=$(sent_by "$_c") || return 1
    if [ -n "$token" ] && [ "$_by" = "$token" ]; then
      printf '%s\n' "$_c" >> "$rec/.store.keep"
    else
      printf '%s\n' "$_c" >> "$rec/.store.over"
    fi
  done < "$rec/.store.clash"
  mv "$rec/.store.keep" "$rec/.store.clash"
  [ -s "$rec/.store.over" ] || return 0
  awk -F '\t' 'FILENAME == ARGV[1] { over[$0] = 1; next } ($1 in over)' \
    "$rec/.store.over" "$1" > "$rec/.store.overlist"
  push "$rec/.store.overlist" "" || return 1
  cut -f1 "$rec/.store.overlist" >> "$rec/.store.sent"
}
meta_last() {  # the .metadata of each checkpoint waiting (.store.meta), once the bucket
  # holds every file it names at the size it needs (checkpoint_layout.py lacks); until
  # then it waits, said once in the log with the files it waits for. 1: a look failed
  [ -s "$rec/.store.meta" ] || return 0
  : > "$rec/.store.meta.next"
  _bad=0
  while IFS= read -r _m; do
    [ -f "$out/$_m" ] || continue  # gone (the run removed an old checkpoint)
    _d=.
    case $_m in */*) _d=${_m%/*} ;; esac
    if ! "$rclone" --config "$cfg" lsjson "store:$dest/$_d" --files-only --retries 1 \
      --low-level-retries 2 --contimeout 10s --timeout 60s > "$rec/.store.ls" \
      2>> "$rec/.store.err"; then
      echo "[]" > "$rec/.store.ls"  # a folder not there yet: nothing of it
    fi
    if ! "$py" "$lib/checkpoint_layout.py" lacks "$out/$_d" < "$rec/.store.ls" \
      > "$rec/.store.lacks" 2>> "$rec/.store.err"; then
      printf '%s\n' "$_m" >> "$rec/.store.meta.next"
      _bad=1
      continue
    fi
    if [ -s "$rec/.store.lacks" ]; then
      printf '%s\n' "$_m" >> "$rec/.store.meta.next"
      if ! grep -qxF "$_m" "$rec/.store.said"; then
        printf '%s\n' "$_m" >> "$rec/.store.said"
        say "$_d: its $(basename "$_m") waits until the bucket holds what it names: $(tr '\n' ' ' < "$rec/.store.lacks" | cut -c1-400)"
      fi
      continue
    fi
    printf '%s\n' "$_m" > "$rec/.store.one"
    if send "$out" "" "$rec/.store.one"; then
      grep -vxF "$_m" "$rec/.store.said" > "$rec/.store.said.next"
      mv "$rec/.store.said.next" "$rec/.store.said"
    else
      printf '%s\n' "$_m" >> "$rec/.store.meta.next"
      _bad=1
    fi
  done < "$rec/.store.meta"
  mv "$rec/.store.meta.next" "$rec/.store.meta"
  return $_bad
}
round() {  # $1: 1 at the end (the record too, whatever the time); 0 when everything went.
  # One rclone for what changed (outputs, and the record when due: with outputs, in the
  # round after them, the log then saying which snapshot it is, and every 30 s), one
  # more only for a big file. A checkpoint's .metadata waits for meta_last; a node that
  # copies outputs only sends what it never sent before check-first (first_push)
  touch "$rec/.store.next"
  changed "$out" "$rec/.store.synced" "" "$since" > "$rec/.store.all"
  # .metadata: last (meta_last); a file said to clash: never again
  awk -F '\t' -v meta="$rec/.store.meta.add" 'FILENAME == ARGV[1] { skip[$0] = 1; next }
    ($1 in skip) { next }
    { n = split($1, p, "/") } p[n] == ".metadata" { print $1 >> meta; next } { print }' \
    "$rec/.store.conflicts" "$rec/.store.all" > "$rec/.store.list"
  if [ -s "$rec/.store.meta.add" ]; then
    cat "$rec/.store.meta.add" >> "$rec/.store.meta"
    sort -u -o "$rec/.store.meta" "$rec/.store.meta"
    rm -f "$rec/.store.meta.add"
  fi
  : > "$rec/.store.rlist"
  now=$(date +%s)
  logs=0
  if [ "$1" = 1 ] || [ "$moved" = 1 ] || [ -s "$rec/.store.list" ] || [ -s "$rec/.store.meta" ] \
    || [ $((now - last_logs)) -ge "$logs_every" ]; then
    logs=1
    [ "$role" = record ] && changed "$rec" "$rec/.store.logs" 1 "" 'generation*' > "$rec/.store.rlist"
  fi
  moved=0
  [ -s "$rec/.store.list" ] && moved=1
  if [ $logs = 1 ]; then  # with outputs, the record, every 30 s and at the end
    : > "$rec/.store.err"
    if [ "$role" = record ]; then
      fenced
      _f=$?
    else
      follows
      case $? in 0) _f=1 ;; 3) _f=0 ;; 4) return 4 ;; *) _f=2 ;; esac
    fi
    case $_f in
      0) return 3 ;;
      2) [ -s "$rec/.store.err" ] || echo "its generation could not be read" > "$rec/.store.err"
         return 1 ;;
    esac
  fi
  if [ "$role" = record ] && { [ -s "$rec/.store.list" ] || [ -s "$rec/.store.rlist" ]; }; then
    claim || return 1
  fi
  if [ -s "$rec/.store.rlist" ]; then  # the record (the master's)
    stage=$rec/.store.stage
    rm -rf "$stage" && mkdir -p "$stage" || return 1
    : > "$rec/.store.bigrec"
    stage_from "$rec" "$rec/.store.rlist" ".vmrun/" "$rec/.store.bigrec"
    if [ -n "$(ls -A "$stage")" ]; then send "$stage" "" "" || return 1; fi
    if [ -s "$rec/.store.bigrec" ]; then send "$rec" /.vmrun "$rec/.store.bigrec" || return 1; fi
  fi
  if [ -s "$rec/.store.list" ]; then  # outputs: its own again as they are, others check-first
    rm -f "$rec/.store.own"
    sort -u -o "$rec/.store.sent" "$rec/.store.sent"
    awk -F '\t' -v own="$rec/.store.own" 'FILENAME == ARGV[1] { sent[$0] = 1; next }
      ($1 in sent) { print >> own; next } { print }' \
      "$rec/.store.sent" "$rec/.store.list" > "$rec/.store.new"
    if [ -s "$rec/.store.own" ]; then
      push "$rec/.store.own" "" || return 1
      rm -f "$rec/.store.own"
    fi
    first_push "$rec/.store.new" || return 1
  fi
  meta_last || return 1
  if [ $logs = 1 ]; then
    touch -r "$rec/.store.next" "$rec/.store.logs"
    last_logs=$now
  fi
  mv "$rec/.store.next" "$rec/.store.synced"
  if [ "$1" = 1 ] && [ -s "$rec/.store.meta" ]; then  # the end waits for the last shards
    error="$(head -n 1 "$rec/.store.meta") waits for the files it names"
    echo "$error" > "$rec/.store.err"
    return 1
  fi
}
failed() {  # what went wrong, and how much waits: the lists' sizes summed
  error=$(grep -v '^[[:space:]]*$' "$rec/.store.err" 2>/dev/null | tail -n 1 \
    | sed 's/^[0-9/]* [0-9:]* *//; s/^ERROR : //; s/^Attempt [0-9/]* failed with [0-9]* errors and: //' \
    | tr -d '"\134' | tr -c '[:print:]' ' ' | cut -c1-300)
  error=${error:-the copy failed}
  pending_files=$(cat "$rec/.store.list" "$rec/.store.rlist" 2>/dev/null | wc -l)
  pending_bytes=$(cat "$rec/.store.list" "$rec/.store.rlist" 2>/dev/null \
    | awk -F '\t' '{ s += $NF } END { print s + 0 }')
}
replaced() {  # stopped because a newer attempt took the run over: no last pass
  [ "$(head -n 1 "$rec/stopped" 2>/dev/null)" = replaced ]
}
finish() {  # the copy is over (done, replaced, given up): its work files go
  rm -rf "$rec/.store.next" "$rec/.store.list" "$rec/.store.rlist" "$rec/.store.big" \
    "$rec/.store.bigrec" "$rec/.store.err" "$rec/.store.stage" "$rec/.store.state" \
    "$rec/.store.all" "$rec/.store.new" "$rec/.store.own" "$rec/.store.clash" \
    "$rec/.store.ls" "$rec/.store.lacks" "$rec/.store.one" "$rec/.store.meta.next" \
    "$rec/.store.said.next" "$rec/.store.meta.add" "$rec/.store.state.tmp" \
    "$rec/.store.over" "$rec/.store.keep" "$rec/.store.overlist"
  # what waits, clashed or went (a later attempt's copier goes on from it), when there is any
  for _k in meta conflicts sent said; do
    [ -s "$rec/.store.$_k" ] || rm -f "$rec/.store.$_k"
  done
  echo stop
  exit 0
}
# one pass: run_agent.py's copy loop (store_copier.py) runs one every few seconds, with END 1
# once the run has ended
[ "$first" = 1 ] && state syncing
if replaced; then state replaced; finish; fi
round "$end"
sent=$?
if [ "$sent" = 3 ]; then state replaced; finish; fi
if [ "$sent" = 4 ]; then  # its master has not claimed this attempt yet: nothing sent
  waited_since=${waited_since:-$(date +%s)}
  if [ "$end" = 1 ]; then
    echo "the run's master has not claimed this attempt in the bucket" > "$rec/.store.err"
    sent=1
  else
    if [ $(($(date +%s) - waited_since)) -ge $((logs_every * 2)) ] \
      && ! grep -qxF claim "$rec/.store.said"; then
      echo claim >> "$rec/.store.said"
      say "the copy to $url waits for the run's master to claim this attempt in the bucket"
    fi
    state waiting
    keep "$every"
  fi
fi
if [ "$sent" = 0 ]; then
  synced=$(date +%s) pending_files=0 pending_bytes=0
  if [ -n "$failing_since" ]; then
    say "the copy to $url caught up"
    failing_since='' error=''
  fi
  backoff=0
  if [ "$end" = 1 ]; then state 'done'; finish; fi
  state ok
else
  failed
  if [ -z "$failing_since" ]; then
    failing_since=$(date +%s)
    say "the copy to $url failed ($error); the run goes on, and the copy is tried again"
  fi
  if [ "$end" = 1 ]; then
    ended_at=${ended_at:-$(date +%s)}
    if [ $(($(date +%s) - ended_at)) -ge "$final_wait" ]; then
      say "gave up copying to $url, $final_wait s after the run ended ($error); its files are on this host"
      state gave-up
      finish
    fi
  fi
  state failing
  backoff=$((backoff * 2))
  [ "$backoff" -ge 1 ] || backoff=1
  [ "$backoff" -le "$backoff_max" ] || backoff=$backoff_max
fi
if [ "$backoff" -gt 0 ]; then keep "$backoff"; else keep "$every"; fi
