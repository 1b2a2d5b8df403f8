"""AWS EC2 as a provider (boto3, the `vmrun[aws]` extra, imported only when a cloud command
runs). Credentials come from boto3's own chain (AWS_PROFILE / --profile, the environment,
~/.aws); vmrun never reads, prints or records them."""
