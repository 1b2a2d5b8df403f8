#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:05:00
#SBATCH -J nersc-ddp
#SBATCH -o %x-%j.out

module load torchenv/1.0
export MASTER_ADDR=$(hostname)
srun -l bash -c "source export_DDP_vars.sh && python ddp_train.py --epochs 2 --out nersc-out"
