"""Runs on this machine (`--local`), a peer of the SSH hosts and the Slurm cluster: the run
is launched, streamed and stopped in this terminal (vmrun.runs.local), so it cannot be
detached, recovered, copied to a bucket or wired across hosts.

- `backend`  `LocalBackend`, the api.Backend verbs a run on this machine has;
- `records`  `LocalRun`: a run's record under the project's results/<run-id>/ as a `RunRow`.
"""

from vmrun.backends.api import Capabilities

# what a run on this machine can do: train's, sweep's and submit's refusals derive from it
CAPABILITIES = Capabilities("this machine (--local)", files_elsewhere=False)
