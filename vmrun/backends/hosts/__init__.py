"""Runs on SSH hosts: each node a detached process tree recorded under ~/.vmrun/runs/<id>/.

- `backend`     `HostsBackend`, the api.Backend over the pieces below: start checks,
                preflights, stages and starts every node detached;
- `training`    `vmrun train` on hosts: start, then detach or follow, `--fetch-every`;
- `preflight`   each host's interpreter, GPUs and busy state, the node order;
- `staging`     the project or the template trainer onto a host;
- `node_launch` each node's launcher argv and environment; `rendezvous`, `probes`,
                `netfacts`: where the nodes meet and over which interface;
- `records`     a run's record on a host: start, list, log, stop (the host scripts' callers);
- `nodes`       following every node at once: the merged log and the failure rule;
- `resume`, `stale`, `fetching`, `down_after`: `--resume`, old checkpoints, `--fetch-every`,
                `--down-after-run`.
"""

from vmrun.backends.api import Capabilities

# what runs on SSH hosts can do: train's, sweep's and submit's refusals are derived from it
CAPABILITIES = Capabilities(
    "SSH hosts (-H)",
    detach=True,
    several_hosts=True,
    concurrent_starts=True,
    fresh=True,
    resume=True,
    fetch_every=True,
    power_off=True,
    recovery=True,
    spares=True,
    supervisor=True,
    gpu_health=True,
    data=True,
    store=True,
    max_cost=True,
    several_nodes=True,
    autostop=True,
    container_engine=True,
    relay_push=True,
)
