#!/bin/bash
#SBATCH --job-name=waits
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err
echo "started on $(hostname)"
echo "to stderr" >&2
while [ ! -e stop-waiting ]; do sleep 0.2; done
echo never
