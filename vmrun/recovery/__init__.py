"""Runs that recover by themselves (`train --recover`): what is decided when a run fails
(policy.py), and the supervisor that does it from a host that outlives the laptop."""
