# slurm_submit_script.sh RECORD_DIR META_BYTES NOTIFY_BYTES CODE_DIR SCRIPT PATCH_BYTES
#   RECOVER_BYTES CHDIR N FOLDER*N SBATCH_ARG...: submits the user's own
# batch script as it is, from CODE_DIR (the synced project: the job's working directory
# unless the script says --chdir): `sbatch --parsable SBATCH_ARG...` (vmrun's options, the
# script, its arguments), in a login shell as the user's own `sbatch` at the prompt runs
# (the job inherits sbatch's environment: the profile's PATH, conda, the `module` function
# that scripts call). stdin holds run.json, the run's notify.json (NOTIFY_BYTES; 0: none:
# vmrun following the job tells its end), the uncommitted diff of the run's code (PATCH_BYTES:
# the record's code.patch), `submit --recover`'s lines (RECOVER_BYTES; 0: none), then the
# run's environment file (0600: it may hold secrets), read after the profile. SCRIPT
# (relative to CODE_DIR) is kept in the record as batch.sh: the script as this job ran it,
# whatever the project's copy becomes; with RECOVER_BYTES, those lines go in after its #!
# and #SBATCH header, and the SBATCH_ARGs name that copy. CHDIR: the script's --chdir
# ("": none; relative to CODE_DIR), which must exist; the N FOLDERs, where its --output/--error
# files go (relative to CHDIR, or absolute; `%u`: the user), are made when missing, as the
# user (`made=FOLDER`), since sbatch makes none and a job without them loses its output. A
# folder that cannot be made, or a missing CHDIR: `FOLDER: why` on stderr, exit 3.
# Prints `job=ID` and the job's first state, or sbatch's own error on stderr (exit 2);
# nothing is left of a refused job.
d=$1 size=$2 told=$3 code=$4 script=$5 patch=$6 recover=$7 chdir=$8 n=$9
shift 9
mask=$(umask)  # the job's files get the user's umask (sbatch passes it on), not 077
umask 077
mkdir -p "$d" || exit 1
head -c "$size" > "$d/run.json" || exit 1
if [ "$told" -gt 0 ]; then head -c "$told" > "$d/notify.json" || exit 1; fi
if [ "$patch" -gt 0 ]; then head -c "$patch" > "$d/code.patch" || exit 1; fi
if [ "$recover" -gt 0 ]; then head -c "$recover" > "$d/recover.bash" || exit 1; fi
cat > "$d/env" || exit 1
if ! cd "$code" 2>/dev/null; then
  echo "no directory $code" >&2
  rm -rf "$d"
  exit 2
fi
umask "$mask"
wd=${chdir:-.}
if [ ! -d "$wd" ]; then
  echo "$chdir: the script's --chdir is not a folder on the cluster" >&2
  rm -rf "$d"
  exit 3
fi
me=$(id -un)
made=  # the first folder each mkdir made, one a line: removed again (if still empty) on a refusal
unmake() {
  printf '%s' "$made" | while IFS= read -r top; do
    [ -n "$top" ] && find "$top" -depth -type d -empty -delete 2>/dev/null
  done
}
while [ "$n" -gt 0 ]; do
  f=$(printf '%s' "$1" | sed "s/%u/$me/g"); shift; n=$((n - 1))
  case $f in /*) ;; *) [ "$wd" = . ] || f=$wd/$f ;; esac
  [ -d "$f" ] && continue
  top=$f
  while [ "${top%/*}" != "$top" ] && [ -n "${top%/*}" ] && [ ! -d "${top%/*}" ]; do top=${top%/*}; done
  if ! why=$(mkdir -p -- "$f" 2>&1); then
    printf '%s: %s\n' "$f" "${why##*: }" >&2
    unmake
    rm -rf "$d"
    exit 3
  fi
  made="$made$top
"
  printf 'made=%s\n' "$f"
done
if [ "$recover" -gt 0 ]; then
  # shellcheck disable=SC2016  # awk's own fields
  awk -v lines="$d/recover.bash" 'function put(l) { while ((getline l < lines) > 0) print l }
    head && !(NR == 1 || /^[ \t]*#/ || /^[ \t]*$/) { put(); head = 0 }
    { print } END { if (head) put() }' head=1 "$script" > "$d/batch.sh" || exit 1
  rm -f "$d/recover.bash"
else
  cp -- "$script" "$d/batch.sh" 2>/dev/null || true
fi
date +%s.%N > "$d/since"  # this clock: what the job writes after it is its output (fetch)
shell='bash'
command -v bash >/dev/null 2>&1 || shell='sh'
# shellcheck disable=SC2016  # expanded by the login shell
if ! out=$("$shell" -l -c '. "$1"; shift; sbatch --parsable "$@"' vmrun-sbatch "$d/env" "$@" \
  2>"$d/sbatch.err" </dev/null); then
  cat "$d/sbatch.err" >&2
  unmake
  rm -rf "$d"
  exit 2
fi
# the job id is sbatch's last line (a profile may print before it): ID or ID;CLUSTER
job=$(printf '%s\n' "$out" | sed -n 's/^\([0-9][0-9]*\).*$/\1/p' | tail -n 1)
if [ -z "$job" ]; then
  printf 'sbatch printed no job id: %s\n' "$out" >&2
  exit 1
fi
printf '%s\n' "$job" > "$d/jobid"
printf 'job=%s\nstate=%s\n' "$job" "$(squeue -h -j "$job" -o '%T|%r' 2>/dev/null | head -n 1)"
