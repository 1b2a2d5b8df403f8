# List runs: sh -c SOURCE vmrun-list RUNS_DIR [ID...]
# The host's clock, then one block per run (every run, or these), as KEY VALUE lines; times by
# the host's clock (FIRST: the first attempt's start, BEGAN: this attempt's). PROGRESS is
# what this attempt reported: the last line of its metrics.jsonl (METRICS), else its last
# `epoch N/M` log line; never a line of an earlier attempt. SAVED: the log's last line about a
# saved snapshot, of any attempt (where a resume starts from). VERSIONS: versions.json's line
# (hostside/run_provenance.py: python, torch, CUDA, NCCL, GPU, driver). FAILURE: an ended
# run's failure.json (hostside/run_failure.py: the first failed worker's rank, host, code).
# STORE: where its copy to a bucket stands (store_sync.sh's store.json), on the node copying.
# NOTICE: a cloud's notice that the node goes (spot_watch.py's notice), REQUEUE: the run stopped
# after its snapshot to go on elsewhere (the template's requeue file: its epoch).
# STOPPED: when, and by what (run_stop.sh's WHY). RECOVERING: its supervisor is bringing it
# back (run_note.sh). RECOVERIES: how many times its supervisor brought it back or gave up (run_note.sh), and the
# last of them (KIND<TAB>TIME<TAB>TEXT). HANG: its hang watcher found it stuck (hang_watch.py's
# hang: since, seen, ranks, action). BUDGET: it reached its --max-cost (budget_watch.py's budget).
base=$1; shift
# vmrun-inline: run_alive.sh
# Few processes a run (a listing of 50 runs spent most of its time starting ~16 processes a
# run: cat, stat, head, tail, grep): small files are read by the shell, the times and the
# log's size come from one stat, and a log of at most 64 KiB is searched by one awk. What
# each line says is the same.
# whole FILE: $_v is what "$(cat FILE)" says, read by the shell where FILE is one line.
whole() {
  _v='' _w=''
  { IFS= read -r _v; IFS= read -r _w; } 2>/dev/null < "$1" || [ -n "$_w" ] || return 0
  _v=$(cat "$1" 2>/dev/null)
}
# first FILE BYTES: $_v is "$(head -n 1 FILE | head -c BYTES)", read by the shell where the
# line is surely short enough (a character is at most 4 bytes).
first() {
  _v=''
  IFS= read -r _v 2>/dev/null < "$1"
  [ $((${#_v} * 4)) -le "$2" ] || _v=$(head -n 1 "$1" | head -c "$2")
}
cd "$HOME" 2>/dev/null || exit 0
echo "NOW $(date +%s)"
[ -d "$base" ] || exit 0
if [ $# -eq 0 ]; then
  for d in "$base"/*/; do
    d=${d%/}
    [ -d "$d" ] && set -- "$@" "${d##*/}"
  done
fi
for id in "$@"; do
  d="$base/$id"
  [ -f "$d/run.json" ] || continue
  echo "RUN $id"
  echo "META $(base64 -w0 < "$d/run.json")"
  whole "$d/out_dir"; out=$_v
  began='' ended='' stopped_at='' log_size='' metrics_at=''
  while IFS= read -r _line; do  # MTIME SIZE NAME
    _t=${_line%% *}; _rest=${_line#* }; _s=${_rest%% *}
    case ${_rest#* } in
      "$d/pid") began=$_t ;;
      "$d/exit_code") ended=$_t ;;
      "$d/stopped") stopped_at=$_t ;;
      "$d/log") log_size=$_s ;;
      "$out/metrics.jsonl") metrics_at=$_t ;;
    esac
  done <<EOF
$(stat -c '%Y %s %n' "$d/pid" "$d/exit_code" "$d/stopped" "$d/log" ${out:+"$out/metrics.jsonl"} 2>/dev/null)
EOF
  if [ -f "$d/first_started" ]; then whole "$d/first_started"; echo "FIRST $_v"; fi
  if [ -f "$d/attempt" ]; then whole "$d/attempt"; echo "ATTEMPT $_v"; fi
  if [ -f "$d/versions.json" ]; then first "$d/versions.json" 4096; echo "VERSIONS $_v"; fi
  [ -f "$d/pid" ] && echo "BEGAN $began"
  if [ -f "$d/exit_code" ]; then
    whole "$d/exit_code"; echo "EXIT $_v"; echo "ENDED $ended"
    if [ -f "$d/failure.json" ]; then first "$d/failure.json" 4096; echo "FAILURE $_v"; fi
  fi
  if [ -f "$d/stopped" ]; then first "$d/stopped" 32; echo "STOPPED $stopped_at $_v"; fi
  if [ -s "$d/notice" ]; then first "$d/notice" 4096; echo "NOTICE $_v"; fi
  if [ -s "$d/hang" ]; then first "$d/hang" 4096; echo "HANG $_v"; fi
  if [ -s "$d/budget" ]; then first "$d/budget" 4096; echo "BUDGET $_v"; fi
  if [ -s "$d/requeue" ]; then first "$d/requeue" 4096; echo "REQUEUE $_v"; fi
  if [ -f "$d/store.json" ]; then first "$d/store.json" 4096; echo "STORE $_v"; fi
  if [ -s "$d/recovering" ]; then first "$d/recovering" 4096; echo "RECOVERING $_v"; fi
  if [ -s "$d/recoveries" ]; then
    echo "RECOVERIES $(wc -l < "$d/recoveries") $(tail -n 1 "$d/recoveries" | head -c 4096)"
  fi
  if alive_run "$d"; then echo "ALIVE 1"; else echo "ALIVE 0"; fi
  if [ -n "$out" ] && [ -f "$out/metrics.jsonl" ] && [ -f "$d/pid" ] \
     && [ "$metrics_at" -ge "$began" ]; then
    echo "METRICS $(tail -n 1 "$out/metrics.jsonl")"
  fi
  if [ -f "$d/log" ]; then
    if [ -f "$d/log_start" ]; then whole "$d/log_start"; skip=$_v; else skip=0; fi
    case $skip:$log_size in  # (a number the shell reads as octal, and a link: as before)
      *[!0-9:]* | :* | *: | 0[0-9]*) small=0 ;;
      *) small=$((log_size <= 65536)) ;;
    esac
    [ -L "$d/log" ] && small=0
    if [ "$small" = 1 ]; then
      # the whole log is within both windows below: one pass finds this attempt's last
      # `epoch N/M` line (after its first SKIP lines) and the last about a saved snapshot
      p='' s=''
      { IFS= read -r p; IFS= read -r s; } <<EOF
$(awk -v skip="$skip" '{ l = tolower($0) }
  NR > skip && l ~ /epoch[ :=]+[0-9]+ *\/ *[0-9]/ { p = $0 }
  l ~ /snapshot.*saved|saved.*snapshot/ { s = $0 }
  END { print p; print s }' "$d/log")
EOF
    else
      p=$(tail -n "+$((skip + 1))" "$d/log" | tail -c 65536 \
          | grep -aiE 'epoch[ :=]+[0-9]+ */ *[0-9]' | tail -n1)
      s=$(tail -c 262144 "$d/log" | grep -aiE 'snapshot.*saved|saved.*snapshot' | tail -n1)
    fi
    echo "PROGRESS $p"
    echo "SAVED $s"
  fi
done
