"""vmrun: SSH-reachable GPU machines from bare to trained-and-fetched."""

__version__ = "0.1.0"
