#!/bin/bash
#SBATCH --array=0-1
#SBATCH --job-name=arr
echo "task $SLURM_ARRAY_TASK_ID of job $SLURM_ARRAY_JOB_ID argument $1"
echo "task $SLURM_ARRAY_TASK_ID result" > "result-$SLURM_ARRAY_TASK_ID.txt"
exit "$SLURM_ARRAY_TASK_ID"
