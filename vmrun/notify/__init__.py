"""Notifications: a run's end, failure or requeue, and autostop's warning, sent to the
user's services (ntfy, Slack, Discord, a JSON webhook, mail...) named by Apprise's URLs.

From this machine for what vmrun sees while following (through Apprise, an optional extra
imported only when a message is sent), and from the host itself for what happens with no
laptop attached (vmrun/hostside/notify_send.py: stdlib, an HTTP POST to the webhooks the
host can reach). One event is sent once: whoever first claims it in the run's record sends.
"""
