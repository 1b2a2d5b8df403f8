"""Training runs: the plan, launcher argv and environment, run records on hosts, where a run
executes (one backend interface for every kind of place), preflight, staging, rendezvous,
following the nodes, resume, outputs and their periodic fetch."""
