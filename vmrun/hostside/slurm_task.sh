# One Slurm task of a vmrun run (srun starts it on each node: torchrun, one per node; env,
# one per rank; python, one). Slurm's variables are read here, on the task's own node: in
# the batch shell $SLURM_NODEID would be 0 everywhere.
# SIGUSR2 is the time-limit warning (--signal=B:USR2@90, passed on by the batch script;
# NCCL takes SIGUSR1): ignored here, so torchrun's agent and scripts without a handler live
# on, and a script that wants it (vmrun's template) sets its own handler: snapshot,
# $VMRUN_REQUEUE_FILE, exit 0.
trap '' USR2
# what this node is and what the run's Python has (run_provenance.py, put beside the record at
# submission): once per node, detached and niced; its files are provenance-<node>.json
# (in a subshell: not a child of the launcher this shell becomes)
if [ "${SLURM_LOCALID:-0}" = 0 ] && [ -r "$VMRUN_RECORD_DIR/run_provenance.py" ]; then
  nice=
  command -v nice > /dev/null 2>&1 && nice="nice -n 10"
  # shellcheck disable=SC2086  # `nice -n 10`, or nothing
  ( $nice "$VMRUN_PYTHON" "$VMRUN_RECORD_DIR/run_provenance.py" "$VMRUN_RECORD_DIR" \
    --per-node < /dev/null > /dev/null 2>&1 & )
fi
case $VMRUN_LAUNCHER in
  torchrun)
    # torchrun marks each piece of a worker's output (vmrun.runs.lines joins them again)
    # shellcheck disable=SC2016  # torchrun fills in ${rank}
    TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="$(printf '\036')"'[rank${rank}]:'
    export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE
    logs="$VMRUN_RECORD_DIR/workers/attempt-${SLURM_RESTART_COUNT:-0}/node-$SLURM_NODEID"
    exec "$VMRUN_PYTHON" -m torch.distributed.run \
      --nnodes="$SLURM_NNODES" --node-rank="$SLURM_NODEID" \
      --nproc-per-node="$VMRUN_NPROC" --max-restarts="$VMRUN_MAX_RESTARTS" \
      --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \
      --rdzv-id="$SLURM_JOB_ID" --log-dir="$logs" --tee=3 "$@"
    ;;
  env)
    RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS
    LOCAL_WORLD_SIZE=$(( SLURM_NTASKS / SLURM_NNODES ))
    export RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE
    exec "$VMRUN_PYTHON" "$@"
    ;;
  *)
    exec "$VMRUN_PYTHON" "$@"
    ;;
esac
