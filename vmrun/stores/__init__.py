"""Buckets (object stores) as vmrun reaches them: `s3://BUCKET/PREFIX` addresses (url.py),
who may read them (access.py: the user's credentials resolved here the way boto3 does, or
the host's own), and the mover the hosts run (mover.py: rclone, fed its credentials over
stdin, its progress read back as vmrun's Progress). Data goes bucket -> host; this machine
sends only commands."""
