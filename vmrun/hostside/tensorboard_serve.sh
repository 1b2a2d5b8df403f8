# TensorBoard for a run: sh -c SOURCE vmrun-tensorboard PYTHON RELOAD [need|may NAME DIR]...
# Runs under vmrun's command wrapper (quoting.remote_command, with a heartbeat): the wrapper
# holds the SSH channel's stdin and kills this whole process group (TensorBoard and its data
# server) when the channel ends or the client falls silent, so TensorBoard lives exactly as
# long as the `vmrun tensorboard` that started it.
# - PYTHON must import tensorboard (exit 3 if not; 4 if PYTHON itself cannot run);
# - each `need` DIR is served even before it exists (TensorBoard picks it up when it
#   appears), each `may` DIR only if it exists now; `vmrun-serving NAME DIR` on stdout for
#   each (exit 5 when there is none);
# - TensorBoard binds 127.0.0.1 only, on a port the kernel picks (--port 0), and says which
#   on stderr ("TensorBoard X at http://127.0.0.1:PORT/"): vmrun reads it there.
py=$1 reload=$2; shift 2
if ! command -v "$py" >/dev/null 2>&1; then
  echo "vmrun-tensorboard: $py: not found" >&2; exit 4
fi
if ! "$py" -c 'import tensorboard' >/dev/null 2>&1; then
  echo "vmrun-tensorboard: $py cannot import tensorboard" >&2; exit 3
fi
n=0 one="" spec=""
while [ $# -ge 3 ]; do
  kind=$1 name=$2 dir=$3; shift 3
  if [ "$kind" = may ] && [ ! -d "$dir" ]; then continue; fi
  echo "vmrun-serving $name $dir"
  n=$((n + 1)); one=$dir; spec="${spec:+$spec,}$name:$dir"
done
[ "$n" -gt 0 ] || exit 5
if [ "$n" -eq 1 ]; then
  set -- --logdir "$one"
else
  set -- --logdir_spec "$spec"  # one group per folder, named; the slower Python loader
fi
exec "$py" -m tensorboard.main --host 127.0.0.1 --port 0 --reload_interval "$reload" "$@"
