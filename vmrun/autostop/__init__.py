"""Autostop: a watchdog on each host powers it off once it has been idle for a period, so a
forgotten VM stops costing money with nothing running on this side.

settings: what a host's watchdog is told (periods, the power-off command, the session rule);
watchdog: installing, checking, reading and removing it on a host, and the one-off power-off
of `vmrun train --down-after-run`; status: what it reports, in the words `vmrun autostop
--status`, `status` and `watch-gpus` show. What runs on the host is
vmrun/hostside/autostop_*.sh; docs/autostop.md has the rule for idle.
"""
