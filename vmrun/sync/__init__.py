"""Putting a project's code on a host: which files go (ignore rules, git's listing) and how
they go (rsync, or vmrun's own engine)."""
