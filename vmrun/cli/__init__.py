"""The command-line layer: the only part of vmrun that imports typer and rich."""
