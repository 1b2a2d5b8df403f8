#!/bin/bash
#SBATCH --cpus-per-task=1
#SBATCH --time=0-00:05
#SBATCH --output=%N-%j.out #Node_Name-Job_id.out
module load torchenv/1.0
python -m venv --without-pip "$SLURM_TMPDIR/env"
# `pip install torch --no-index` installs the cluster's own wheel; STAND-IN here (no wheel
# install in a test): the module's torch made visible to the new env
python -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
  > "$(echo "$SLURM_TMPDIR"/env/lib/python3*/site-packages)/cluster-torch.pth"
source "$SLURM_TMPDIR/env/bin/activate"
echo "python is $(command -v python) in $VIRTUAL_ENV"
python ddp_train.py --epochs 2 --out servers-out
