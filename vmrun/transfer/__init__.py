"""Moving files over a connection: the shared types, byte streams (paramiko or OpenSSH),
tar framing, remote listings (manifest), hashing, and verified downloads and uploads."""
