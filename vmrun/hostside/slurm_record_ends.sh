# slurm_record_ends.sh RECORD_DIR EVENT EXIT: a job from the user's own batch script that
# squeue shows ended and that nothing followed (`vmrun status` saw it first): its ends
# (stdin: the `ended` lines) kept in the record, once, before squeue forgets the job; and,
# when the run has a notify.json, its end told from the login node (notify_send.py beside
# this script, in a session of its own: its bounded tries outlive this command; once: the
# event is claimed in the record, as a follower would claim it).
d=$1
[ ! -e "$d/ended" ] || exit 0
cat > "$d/ended" || exit 1
if [ -r "$d/notify.json" ] && command -v python3 > /dev/null 2>&1; then
  setsid -f python3 "${0%/*}/notify_send.py" "$d" send "$2" "$3" \
    < /dev/null >> "$d/notify.log" 2>&1
fi
