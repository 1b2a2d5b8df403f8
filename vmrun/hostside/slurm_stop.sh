# slurm_stop.sh RECORD_DIR JOB DEADLINE: cancel the job (Slurm sends SIGTERM to every step
# and the batch script, then SIGKILL after its KillWait), then wait until the job has left
# the running states and no step of it is left; prints what it found before and after.
d=$1 job=$2 deadline=$3
date +%s > "$d/stopped"
before=$(squeue -h -j "$job" -o '%T' 2>/dev/null)
printf 'before=%s\n' "$before"
[ -n "$before" ] || exit 0
scancel "$job" || exit 1
i=0
while [ "$i" -lt "$((deadline * 5))" ]; do
  s=$(squeue -h -j "$job" -o '%T' 2>/dev/null)
  steps=$(squeue -h -s -j "$job" -o '%i' 2>/dev/null)
  if [ -z "$s$steps" ]; then printf 'after=\n'; exit 0; fi
  sleep 0.2
  i=$((i + 1))
done
printf 'after=%s\nsteps=%s\n' "$s" "$steps" | tr '\n' ' '
exit 3
