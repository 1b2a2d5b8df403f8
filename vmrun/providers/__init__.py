"""Where hosts come from: a cloud provider makes VMs, and vmrun records them as hosts in
vmrun.toml, so every command works on them as on any SSH host. Providers produce hosts and
never import a backend (`api.py` is the seam; `aws/` is the one built)."""
