# What a host offers a run inside an image, in one round trip:
#   sh -c SOURCE vmrun-container-probe CONTAINER_HOME SRC...
# Prints the runtimes it has, one name per line (container_detect.sh's rule), then
# `ID UID GID` (the user's, for --user), then `MISSING` and each mount source SRC that does
# not exist (Docker would create an empty, root-owned one). Makes CONTAINER_HOME (relative
# to the home): the HOME a run's container writes its caches to.
home=$1
shift
mkdir -p "$HOME/$home" 2>/dev/null || true
# vmrun-inline: container_detect.sh
echo "ID $(id -u) $(id -g)"
echo MISSING
# vmrun-inline: container_mounts.sh
