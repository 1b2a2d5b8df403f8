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

from vmrun.backends.api import Capabilities

# what a Slurm job can do: train's, sweep's and submit's refusals are derived from it
CAPABILITIES = Capabilities(
    "a Slurm cluster (-C)",
    detach=True,
    recovery=True,
    self_requeue=True,
    scheduler=True,
    data=True,
    max_cost=True,
    queued_sweeps=True,
    own_scripts=True,
    several_nodes=True,
)
