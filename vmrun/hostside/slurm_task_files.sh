# slurm_task_files.sh RECORD_DIR JOB WORKDIR OUTPAT ERRPAT ARRAY NAME LINES: the output and error
# files of a job from the user's own batch script, as they are now (their last LINES lines;
# 0: all), every line `\036KEY o|e\036TEXT` as slurm_follow_tasks.sh frames them. The files
# are those the follower recorded, those of the tasks squeue lists now, and, for a job that
# neither knows any more, the files its patterns match that the job wrote (newer than its
# submission).
d=$1 job=$2 work=$3 outpat=$4 errpat=$5 array=$6 name=$7 lines=$8
# vmrun-inline: _slurm_tasks.sh
user=$(id -un)
list=$(mktemp) || exit 1
trap 'rm -f "$list"' EXIT
if [ -r "$d/files" ]; then cat "$d/files" > "$list"; fi
if q=$(tasks "$job" 2>/dev/null) && [ -n "$q" ]; then
  printf '%s\n' "$q" | while IFS= read -r line; do
    files "$line" "$work" "$outpat" "$errpat" "$user"
  done >> "$list"
fi
if [ ! -s "$list" ]; then
  for s in o e; do
    if [ "$s" = o ]; then p=$outpat; else p=$errpat; fi
    [ "$s" = o ] || [ "$p" != "$outpat" ] || continue
    if [ "$array" = 1 ]; then t='*' i='*'; else t=4294967294 i=$job; fi
    g=$(expand "$p" "$i" "$job" "$t" '*' "$user" "$name")
    case $g in /*) ;; *) g=$work/$g ;; esac
    # shellcheck disable=SC2086  # the pattern is a glob
    for f in $g; do
      if [ ! -f "$f" ] || [ -z "$(find "$f" -prune -newer "$d/run.json")" ]; then continue; fi
      if [ "$array" = 1 ]; then k=${f##*/}; else k=-; fi
      printf '%s %s %s\n' "$k" "$s" "$f"
    done
  done > "$list"
fi
sort -u "$list" | while read -r k s p; do
  [ -r "$p" ] || continue
  if [ "$lines" -gt 0 ]; then tail -n "$lines" -- "$p"; else cat -- "$p"; fi |
    awk -v k="$k $s" '{ printf "\036%s\036%s\n", k, $0 }'
done
