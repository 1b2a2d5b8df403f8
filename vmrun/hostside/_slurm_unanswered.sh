# Shared by slurm_follow.sh and slurm_follow_tasks.sh (inlined, not installed alone): what
# a follower does when squeue fails. Only an answer ends a job: `unanswered ERRFILE LIMIT` returns
# 0 when squeue's error is an answer (the controller no longer knows the job), else says
# once that the controller does not answer (`\035vmrun unreachable ERROR`) and returns 1,
# or, after LIMIT seconds without an answer, says `\035vmrun lost SECONDS` and returns 2.
# `answered` says `\035vmrun reachable` once squeue answers again.
down=''  # since when squeue has not answered
unanswered() {
  if grep -q 'Invalid job id' "$1"; then return 0; fi
  u_now=$(date +%s)
  if [ -z "$down" ]; then
    down=$u_now
    printf '\035vmrun unreachable %s\n' "$(head -n 1 "$1")"
  elif [ $((u_now - down)) -ge "$2" ]; then
    printf '\035vmrun lost %s\n' $((u_now - down))
    return 2
  fi
  return 1
}
answered() {
  if [ -n "$down" ]; then down=; printf '\035vmrun reachable\n'; fi
}
