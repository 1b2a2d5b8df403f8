"""`vmrun dashboard`: every run, its log, metrics and stacks, and the GPUs on one page in a
browser, served from this machine by the same operations the CLI calls (vmrun.operations)
over one SSH connection per host (vmrun.ssh.pool). A view, as vmrun.cli is: nothing here
reads a host by itself. aiohttp (the `dashboard` extra) is imported only by `app` and
`server`."""
