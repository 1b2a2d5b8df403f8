"""Setting hosts up: the playbook schema, host facts, planning steps against fingerprints,
running them (with reboots), and recording the resulting environment."""
