# Shared by slurm_follow_tasks.sh and slurm_task_files.sh (inlined, not installed alone):
# a job's tasks as squeue lists them, and the file names its output patterns give each.

# tasks JOB: one line per task (an array's pending tasks one each), fields split by '|':
# JOBID|ARRAYJOB|TASK|NAME|HOST|STATE|EXIT|START|ELAPSED|NODES|REASON (TASK is N/A outside an
# array; EXIT is the wait status, as the kernel gives it). squeue's exit code for stderr.
tasks() {
  squeue -h -r --states=all -j "$1" \
    -O 'JobID:|,ArrayJobID:|,ArrayTaskID:|,Name:|,BatchHost:|,State:|,exit_code:|,StartTime:|,TimeUsed:|,NodeList:|,Reason:'
}

# expand PATTERN JOBID ARRAYJOB TASK HOST USER NAME: a file name pattern as Slurm expands it
# for a batch script (%j %J %A %a %b %N %n %t %s %u %x %%, a width pads numbers with zeros;
# a backslash anywhere turns every replacement off and is dropped).
expand() {
  printf '%s\n' "$1" | awk -v j="$2" -v A="$3" -v a="$4" -v N="$5" -v u="$6" -v x="$7" '
    index($0, "\\") { gsub(/\\/, ""); print; next }
    {
      s = $0; out = ""
      while ((i = index(s, "%")) > 0) {
        out = out substr(s, 1, i - 1); s = substr(s, i + 1)
        match(s, /^[0-9]*/); w = substr(s, 1, RLENGTH); s = substr(s, RLENGTH + 1)
        c = substr(s, 1, 1); s = substr(s, 2)
        if (c == "%") v = "%"
        else if (c == "j") v = j
        else if (c == "J") v = j ".batch"
        else if (c == "A") v = A
        else if (c == "a") v = a
        else if (c == "b") v = a % 10
        else if (c == "N") v = N
        else if (c == "n" || c == "t") v = 0
        else if (c == "s") v = "batch"
        else if (c == "u") v = u
        else if (c == "x") v = x
        else v = "%" w c
        if (w != "" && v ~ /^[0-9]+$/) v = sprintf("%0" w "d", v)
        out = out v
      }
      print out s
    }'
}

# files LINE WORKDIR OUTPAT ERRPAT USER: `KEY o PATH` (and `KEY e PATH` for a separate error
# file) of one task line of `tasks`, relative patterns under WORKDIR; nothing while the
# task has no node yet.
files() {
  IFS='|' read -r f_id f_array f_task f_name f_host _ <<EOT
$1
EOT
  case $f_host in ""|n/a|N/A|"(null)") return 0 ;; esac
  f_key=$f_task
  case $f_task in N/A|"") f_key=- f_array=$f_id f_task=4294967294 ;; esac
  f_out=$(expand "$3" "$f_id" "$f_array" "$f_task" "${f_host%%.*}" "$5" "$f_name")
  f_err=$(expand "$4" "$f_id" "$f_array" "$f_task" "${f_host%%.*}" "$5" "$f_name")
  case $f_out in /*) ;; *) f_out=$2/$f_out ;; esac
  case $f_err in /*) ;; *) f_err=$2/$f_err ;; esac
  printf '%s o %s\n' "$f_key" "$f_out"
  if [ "$f_err" != "$f_out" ]; then printf '%s e %s\n' "$f_key" "$f_err"; fi
}
