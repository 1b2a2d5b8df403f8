"""A Slurm cluster that vmrun makes of SSH hosts (`vmrun setup --slurm NAME`): the real
slurmctld, slurmd and munge from the distribution, configured from each host's facts.

conf: the facts and the files made of them; making: doing it on the hosts, and undoing it.
"""
