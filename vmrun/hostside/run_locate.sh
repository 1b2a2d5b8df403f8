# Where a run is: sh -c SOURCE vmrun-locate RUNS_DIR [ID]
# Prints the run id, the host's clock when it first started, then its run.json. Without an
# id: the newest run.json (rewritten at each start), so the run started (or resumed) last.
# Exit 3: no runs folder; 4: no such run.
cd "$HOME" 2>/dev/null || exit 3
base=$1
[ -d "$base" ] || exit 3
if [ -n "$2" ]; then id=$2
else
  # shellcheck disable=SC2012  # run ids are [A-Za-z0-9._-]: ls -t is safe and simplest
  f=$(ls -1t "$base"/*/run.json 2>/dev/null | head -n 1); id=${f%/run.json}; id=${id##*/}
fi
[ -n "$id" ] && [ -f "$base/$id/run.json" ] || exit 4
printf '%s\n' "$id"; cat "$base/$id/first_started" 2>/dev/null || echo; cat "$base/$id/run.json"
