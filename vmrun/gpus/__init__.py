"""GPU telemetry: nvidia-smi's output parsed, and the live watch over a fleet of hosts."""
