# slurm_silent.sh JOB: why a job (or an array task, JOB_TASK) ended before writing a line, as
# far as Slurm tells: its state, reason and exit code (`STATE`, `REASON`, `EXIT` lines from
# `scontrol show job -o`, else sacct's), and for its output and error files (`StdOut`,
# `StdErr`, as Slurm expanded them) `NOFOLDER PATH` when the folder it writes in is missing,
# `NOFILE PATH` when the folder is there but the file is not.
job=$1
line=$(scontrol show job -o "$job" 2>/dev/null | head -n 1)
if [ -n "$line" ]; then
  for key in JobState Reason ExitCode StdOut StdErr; do
    v=$(printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$key=//p" | head -n 1)
    [ -n "$v" ] && printf '%s %s\n' "$key" "$v"
  done
else
  sacct -n -P -X -j "$job" -o State,ExitCode,Reason 2>/dev/null | head -n 1 \
    | awk -F'|' '{ print "JobState " $1; print "ExitCode " $2; print "Reason " $3 }'
fi
for key in StdOut StdErr; do
  f=$(printf '%s\n' "$line" | tr ' ' '\n' | sed -n "s/^$key=//p" | head -n 1)
  case $f in /*) ;; *) continue ;; esac
  if [ ! -d "${f%/*}" ]; then echo "NOFOLDER $f"
  elif [ ! -e "$f" ]; then echo "NOFILE $f"
  fi
done
exit 0
