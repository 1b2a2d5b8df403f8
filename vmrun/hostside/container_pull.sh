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
"$docker" pull "$image"
