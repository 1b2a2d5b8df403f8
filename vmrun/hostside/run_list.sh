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
cd "$HOME" 2>/dev/null || exit 0
echo "NOW $(date +%s)"
[ -d "$base" ] || exit 0
if [ $# -eq 0 ]; then
  for d in "$base"/*/; do [ -d "$d" ] && set -- "$@" "$(basename "$d")"; done
fi
for id in "$@"; do
  d="$base/$id"
  [ -f "$d/run.json" ] || continue
  echo "RUN $id"
  echo "META $(base64 -w0 < "$d/run.json")"
  [ -f "$d/first_started" ] && echo "FIRST $(cat "$d/first_started")"
  [ -f "$d/attempt" ] && echo "ATTEMPT $(cat "$d/attempt")"
  [ -f "$d/versions.json" ] && echo "VERSIONS $(head -n 1 "$d/versions.json" | head -c 4096)"
  [ -f "$d/pid" ] && echo "BEGAN $(stat -c %Y "$d/pid")"
  if [ -f "$d/exit_code" ]; then
    echo "EXIT $(cat "$d/exit_code")"; echo "ENDED $(stat -c %Y "$d/exit_code")"
    [ -f "$d/failure.json" ] && echo "FAILURE $(head -n 1 "$d/failure.json" | head -c 4096)"
  fi
  if [ -f "$d/stopped" ]; then
    echo "STOPPED $(stat -c %Y "$d/stopped") $(head -n 1 "$d/stopped" | head -c 32)"
  fi
  [ -s "$d/notice" ] && echo "NOTICE $(head -n 1 "$d/notice" | head -c 4096)"
  [ -s "$d/hang" ] && echo "HANG $(head -n 1 "$d/hang" | head -c 4096)"
  [ -s "$d/budget" ] && echo "BUDGET $(head -n 1 "$d/budget" | head -c 4096)"
  [ -s "$d/requeue" ] && echo "REQUEUE $(head -n 1 "$d/requeue" | head -c 4096)"
  [ -f "$d/store.json" ] && echo "STORE $(head -n 1 "$d/store.json" | head -c 4096)"
  [ -s "$d/recovering" ] && echo "RECOVERING $(head -n 1 "$d/recovering" | head -c 4096)"
  if [ -s "$d/recoveries" ]; then
    echo "RECOVERIES $(wc -l < "$d/recoveries") $(tail -n 1 "$d/recoveries" | head -c 4096)"
  fi
  if alive_run "$d"; then echo "ALIVE 1"; else echo "ALIVE 0"; fi
  out=$(cat "$d/out_dir" 2>/dev/null)
  if [ -n "$out" ] && [ -f "$out/metrics.jsonl" ] && [ -f "$d/pid" ] \
     && [ "$(stat -c %Y "$out/metrics.jsonl")" -ge "$(stat -c %Y "$d/pid")" ]; then
    echo "METRICS $(tail -n 1 "$out/metrics.jsonl")"
  fi
  if [ -f "$d/log" ]; then
    skip=$(cat "$d/log_start" 2>/dev/null || echo 0)
    p=$(tail -n "+$((skip + 1))" "$d/log" | tail -c 65536 \
        | grep -aiE 'epoch[ :=]+[0-9]+ */ *[0-9]' | tail -n1)
    echo "PROGRESS $p"
    s=$(tail -c 262144 "$d/log" | grep -aiE 'snapshot.*saved|saved.*snapshot' | tail -n1)
    echo "SAVED $s"
  fi
done
