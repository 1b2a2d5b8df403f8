"""Slurm clusters reached through their login node: `vmrun train -C NAME` submits with
sbatch, and status, logs, stop and fetch follow the job there (squeue, scancel, the shared
filesystem). The pieces:

- `cluster`  what vmrun.toml's `[[clusters]]` say, and the login node as an SSH host;
- `job`      the sbatch options and launcher layout a run asks for, checked before anything
             is submitted, and the batch script (vmrun/hostside/slurm_job.bash under a header);
- `queue`    squeue/sacct lines read in a fixed `--format`, and what each Slurm state means;
- `records`  a run's files on the shared filesystem, listed in one round trip;
- `stream`   the lines a followed job prints, made into `[node rankN]` output and notes;
- `backend`  `SlurmBackend`, the backends.api seam over all of the above.
"""
