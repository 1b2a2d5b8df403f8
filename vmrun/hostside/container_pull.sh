# Pull an image: sh -c SOURCE vmrun-container-pull DOCKER IMAGE [REGISTRY USERNAME]
# DOCKER: docker or podman. With REGISTRY and USERNAME it logs in first, the password read
# from $VMRUN_REGISTRY_PASSWORD (vmrun's command wrapper sets it from stdin, so it is on no
# command line) and handed to the runtime on its stdin, into a configuration of this pull's
# own that is removed afterwards: no password is left on the host. The pull's output is the
# runtime's own (vmrun.containers.pull reads it).
docker=$1; image=$2; registry=${3-}; user=${4-}
if [ -n "$registry" ]; then
  conf=$(mktemp -d "${TMPDIR:-/tmp}/vmrun-pull.XXXXXX") || exit 1
  trap 'rm -rf "$conf"' EXIT
  trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
  DOCKER_CONFIG=$conf REGISTRY_AUTH_FILE=$conf/auth.json  # docker's, podman's
  export DOCKER_CONFIG REGISTRY_AUTH_FILE
  if [ -z "${VMRUN_REGISTRY_PASSWORD-}" ]; then
    echo "vmrun: no password for $registry (VMRUN_REGISTRY_PASSWORD)" >&2
    exit 2
  fi
  printf '%s' "$VMRUN_REGISTRY_PASSWORD" \
    | "$docker" login --username "$user" --password-stdin "$registry" >/dev/null || exit
fi
# On a terminal the runtime prints byte counts (its progress bars), which it leaves out on a
# pipe: where script(1) is there, the pull runs on its pseudo-terminal and the redraws
# (carriage returns, cursor moves) come out as plain lines. The terminal is given a width:
# script's has none here (no terminal above it), and podman then cuts each bar to "…".
# `script -e` exits with the pull's status, which the pipe would lose (no pipefail in sh):
# it goes through a file.
if command -v script >/dev/null 2>&1; then
  st=$(mktemp "${TMPDIR:-/tmp}/vmrun-pull-status.XXXXXX") || exit 1
  esc=$(printf '\033')
  { script -qfec "stty cols 200 2>/dev/null; '$docker' pull '$image'" /dev/null < /dev/null; echo $? > "$st"; } \
    | tr '\r' '\n' | sed "s/${esc}\[[0-9;?]*[A-Za-z]//g"
  code=$(cat "$st"); rm -f "$st"
  exit "${code:-1}"
fi
"$docker" pull "$image"
