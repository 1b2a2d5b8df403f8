"""What each command does, as a library: the CLI parses its flags, calls one function here and
renders the value it returns; a Python user calls the same function (pip's `operations/`).
Each takes a `vmrun.reporting.Reporter` for what it says while it works."""
