"""Where a run executes, each place a peer behind one protocol (`api`): `hosts` (SSH hosts,
detached process trees recorded on each host) and `slurm` (a cluster through its login node).
The backends never import each other; what every backend shares (the plan, launcher argv,
outputs, states) is in vmrun.runs, below them."""
