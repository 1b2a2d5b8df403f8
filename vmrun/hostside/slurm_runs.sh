# slurm_runs.sh RUNS_DIR [RUN METRICS ...]: every vmrun run on the cluster in one round trip:
# the user's jobs in squeue, one line per task of an array (a fixed --Format: squeue's JSON
# changed across versions; a field an older squeue lacks is left out at the end), then each
# run's files (run.json, jobid, starts, exit, stopped, since, ended, versions.json,
# failure.json, recoveries, budget, hang, metrics.path; the last line of the metrics file that
# metrics.path names) as `==> PATH <==` sections. RUN METRICS: the metrics.path of a record
# an older vmrun wrote without one (vmrun read the path in its run.json), written first.
r=$1
shift
echo "==> squeue <=="
q=$(squeue -h -r -u "$(id -un)" --states=all \
  -O 'JobArrayID:|,State:|,Reason:|,StartTime:|,TimeUsed:|,NodeList:|,ArrayJobID:|,ArrayTaskID:|,exit_code' \
  2>/dev/null)
[ -n "$q" ] && printf '%s\n' "$q"
cd "$r" 2>/dev/null || exit 0
while [ "$#" -ge 2 ]; do
  case $1 in
    */* | .* | '') ;;
    *) if [ -d "$1" ] && [ ! -e "$1/metrics.path" ]; then printf '%s\n' "$2" > "$1/metrics.path"; fi ;;
  esac
  shift 2
done
set -- */run.json
[ -e "$1" ] || exit 0
# each job's allocation (`scontrol show job -o`: nodes, partition, TRES), kept once, for the
# run's provenance (a user's own batch script runs nothing of vmrun's on its nodes): asked only
# of jobs squeue lists with nodes now (not pending), each once, by the id sbatch gave
placed=" $(printf '%s\n' "$q" | awk -F'|' '{ s = $2; j = $7; gsub(/ /, "", s); gsub(/ /, "", j)
  if (s != "PENDING" && j != "") print j }' | sort -u | tr '\n' ' ')"
limit=
command -v timeout > /dev/null 2>&1 && limit="timeout 10"
for j in */jobid; do
  d=${j%/jobid}
  [ -e "$d/allocation" ] && continue
  id=$(head -n 1 "$j" 2>/dev/null)
  case $placed in *" $id "*) ;; *) continue ;; esac
  # shellcheck disable=SC2086  # `timeout 10`, or nothing
  a=$($limit scontrol show job -o "$id" 2>/dev/null) || continue
  case $a in *" NodeList=(null)"*|"") continue ;; esac
  printf '%s\n' "$a" > "$d/allocation.tmp" && mv "$d/allocation.tmp" "$d/allocation"
done
tail -v -n +1 -- */run.json */jobid */starts */exit */stopped */since */ended */versions.json \
  */failure.json */recoveries */budget */hang */metrics.path 2>/dev/null
echo
# finished jobs leave squeue after MinJobAge: accounting remembers them, where there is any
echo "==> sacct <=="
sacct -n -P -X -j "$(cat -- */jobid 2>/dev/null | tr '\n' ,)" -o JobID,State,ExitCode 2>/dev/null
# the newest metrics line of every run, in one process (the paths its metrics.path names)
metrics=$(cat -- */metrics.path 2>/dev/null)
if [ -n "$metrics" ]; then
  IFS='
'
  # shellcheck disable=SC2086  # one path per line
  tail -v -n 1 -- $metrics 2>/dev/null
fi
exit 0
