# Which container runtimes a host (a cluster's login node, an SSH host) has: sh -c SOURCE
# vmrun-container-detect. Prints one name per line, of those vmrun.containers.runtime knows:
# pyxis when srun takes --container-image (the plugin adds it to srun's own options), the
# others when their binary is on the PATH. Nothing is started; a runtime whose daemon is
# down is still listed (the pull says why it cannot be used).
if command -v srun >/dev/null 2>&1 && srun --help 2>&1 | grep -q -- '--container-image'; then
  echo pyxis
fi
for name in apptainer shifter podman docker; do
  command -v "$name" >/dev/null 2>&1 && echo "$name"
done
true
