"""Buckets (object stores) as vmrun reaches them: `s3://BUCKET/PREFIX` addresses
(vmrun.store_url, below the settings that name one), who may read them (access.py: the
user's credentials resolved here the way boto3 does, or the host's own), the mover the
hosts run (mover.py: rclone, fed its credentials over stdin, its progress read back as
vmrun's Progress), a run's copy to its bucket (sync.py) and what this machine reads there
(bucket.py). Data goes bucket -> host; this machine sends only commands."""
