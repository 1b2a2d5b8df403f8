# slurm_nodes.sh: the nodes of the user's running jobs, one `JOB NODE` line per node (the
# order squeue lists the jobs in, nodes as `scontrol show hostnames` expands the list).
squeue -h -u "$(id -un)" -t RUNNING -o '%i %N' | while read -r job nodes; do
  for node in $(scontrol show hostnames "$nodes"); do
    echo "$job $node"
  done
done
