# slurm_submit.sh RECORD_DIR JOB_BYTES META_BYTES TRAINER_BYTES CODE_DIR [NOTIFY_BYTES
# [PATCH_BYTES COLLECTOR_BYTES [METRICS [record]]]]: stdin holds the batch script, run.json,
# the template trainer (0 bytes: the run's own script), the run's notify.json (its webhooks:
# NOTIFY_BYTES, 0 or none: no notifications), the uncommitted diff of the run's code
# (code.patch), run_provenance.py (which every node of the job runs beside the run) and then
# the run's environment file. Writes them into RECORD_DIR (0700: the environment may hold
# secrets), and METRICS (the run's metrics file, "" for none) into its metrics.path, where
# slurm_runs.sh finds it; submits with `sbatch --parsable`, and prints `job=ID` and the job's
# first state and reason (`state=PENDING|Priority`), or sbatch's own error on stderr (exit 2).
# `record`: only writes them (a node of a cluster without a shared folder, where the job may
# run).
d=$1
umask 077
mkdir -p "$d" || exit 1
(umask 022 && mkdir -p "$5") || exit 1  # the job's working directory (--chdir)
head -c "$2" > "$d/job.sh" && head -c "$3" > "$d/run.json" || exit 1
if [ "$4" -gt 0 ]; then head -c "$4" > "$d/template.py" || exit 1; fi
if [ "${6:-0}" -gt 0 ]; then head -c "$6" > "$d/notify.json" || exit 1; fi
if [ "${7:-0}" -gt 0 ]; then (umask 022 && head -c "$7" > "$d/code.patch") || exit 1; fi
if [ "${8:-0}" -gt 0 ]; then (umask 022 && head -c "$8" > "$d/run_provenance.py") || exit 1; fi
cat > "$d/env" || exit 1
if [ -n "${9:-}" ]; then printf '%s\n' "$9" > "$d/metrics.path" || exit 1; fi
[ "${10:-}" = record ] && exit 0
if ! out=$(sbatch --parsable "$d/job.sh" 2>"$d/sbatch.err"); then
  cat "$d/sbatch.err" >&2
  rm -rf "$d"
  exit 2
fi
job=${out%%;*}
printf '%s\n' "$job" > "$d/jobid"
printf 'job=%s\nstate=%s\n' "$job" "$(squeue -h -j "$job" -o '%T|%r' 2>/dev/null)"
