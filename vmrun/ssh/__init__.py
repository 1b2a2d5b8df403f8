"""Reaching hosts: host specs and the project's inventory, ssh_config, host keys, the
paramiko connection and its channels, one place for shell quoting, command results, the
OpenSSH client wrapper for bulk streams, and groups of hosts worked on in parallel."""
