"""What a training run is, whatever runs it: the plan, launcher argv and environment, its
output lines, its outputs (remote paths), states, sweeps, TensorBoard, and `train --local`.
The backends (vmrun.backends) build on this; nothing here imports them."""
