# Run one container as a run's process: sh -c SOURCE vmrun-container DOCKER NAME GRACE OPTS...
# DOCKER: the runtime's binary (docker or podman, which behave the same here); NAME: the
# container's name (vmrun-RUN-NODE); GRACE: the seconds `stop` waits before it kills;
# OPTS: everything `run` takes after --name (options, image, command).
# The container runs in the foreground of this shell, which is the run's process: a TERM,
# INT or HUP here (`vmrun stop`) becomes `DOCKER stop -t GRACE NAME`, so stopping the run
# stops the container. The engine removes the container once it has exited (--rm): this
# shell may be killed before it could (Slurm's SIGKILL KillWait after its SIGTERM, while a
# loaded machine's `docker stop` still runs), and a stopped run must leave no container.
# The script exits with the container's status (the run's), read before the removal where
# it can be, else the client's (the same code, but 125-127 for the engine's own errors). A
# container of the same name left by an earlier attempt (a killed supervisor) goes first.
docker=$1; name=$2; grace=$3
shift 3
"$docker" rm -f "$name" >/dev/null 2>&1 || true
stopping=
# shellcheck disable=SC2317  # called by the trap
stop() {
  [ -n "$stopping" ] && return
  stopping=1
  "$docker" stop -t "$grace" "$name" >/dev/null 2>&1 || true
}
trap stop TERM INT HUP
# SIGUSR2 (a Slurm job's time-limit warning, which its batch script passes on to the step)
# goes to every process in the container, as it goes to every process of a bare step; the
# container's processes are not the step's, so Slurm's own signal does not reach them
# shellcheck disable=SC2317  # called by the trap
forward() { "$docker" exec "$name" sh -c 'kill -s USR2 -- -1' >/dev/null 2>&1 || true; }
trap forward USR2
[ -n "$stopping" ] && exit 143  # stopped before the container started
# In the background so that `wait` returns when a signal arrives (a trap does not run while
# a foreground command runs); `run` without -i reads no input.
"$docker" run --rm --name "$name" "$@" &
child=$!
status=0
while :; do
  wait "$child"; status=$?
  kill -0 "$child" 2>/dev/null || break
done
# The container's own exit code; the client's status where the container was not made or
# did not start (125: the runtime refused the options or the limits, 127: no such command
# in the image...), which the engine records as a State.Error.
state=$("$docker" inspect --format '{{.State.ExitCode}} {{.State.Error}}' "$name" 2>/dev/null)
"$docker" rm -f "$name" >/dev/null 2>&1 || true
code=${state%% *}; error=${state#"$code"}
case $code in
  ''|*[!0-9]*) exit "$status" ;;
esac
[ -n "${error# }" ] && [ "$status" -ne 0 ] && exit "$status"
exit "$code"
