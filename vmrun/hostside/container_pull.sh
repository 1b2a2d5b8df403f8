# Pull an image: sh -c SOURCE vmrun-container-pull DOCKER IMAGE POLICY [REGISTRY USERNAME]
# DOCKER: docker or podman. POLICY (vmrun.containers.request.PULL_POLICIES), as Docker's and
# Podman's --pull: `always` pulls; `missing` pulls only when the host has no IMAGE; `never`
# pulls nothing (no IMAGE here: exit 3); `newer` pulls, and when the registry cannot be
# reached or has no such image while the host has IMAGE (air-gapped, built or loaded here)
# keeps the host's (`\035vmrun kept WHY`, exit 0); any other failure is the pull's own.
# Done: `\035vmrun image ID` last, the image's ID (its config's digest: the same image has
# the same ID on every host, whatever registry it came from, or none), which vmrun compares
# across nodes.
# With REGISTRY and USERNAME it logs in first, the password read from
# $VMRUN_REGISTRY_PASSWORD (vmrun's command wrapper sets it from stdin, so it is on no
# command line) and handed to the runtime on its stdin, into a configuration of this pull's
# own that is removed afterwards: no password is left on the host. The pull's output is the
# runtime's own (vmrun.containers.pull reads it).
docker=$1; image=$2; policy=${3:-always}; registry=${4-}; user=${5-}
mark() { printf '\035vmrun %s\n' "$*"; }
here() { "$docker" image inspect --format '{{.Id}}' "$image" 2>/dev/null; }
had=$(here)
case $policy in
  never | missing)
    if [ -n "$had" ]; then mark image "$had"; exit 0; fi
    if [ "$policy" = never ]; then
      echo "vmrun: no image $image on this host, and pull = never" >&2
      exit 3
    fi
    ;;
esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmrun-pull.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
if [ -n "$registry" ]; then
  DOCKER_CONFIG=$tmp/conf REGISTRY_AUTH_FILE=$tmp/conf/auth.json  # docker's, podman's
  export DOCKER_CONFIG REGISTRY_AUTH_FILE
  mkdir -p "$DOCKER_CONFIG" || exit 1
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
# The pull's status goes through a file (no pipefail in sh), its output through tee (read
# below when it failed).
if command -v script >/dev/null 2>&1; then
  esc=$(printf '\033')
  { script -qfec "stty cols 200 2>/dev/null; '$docker' pull '$image'" /dev/null < /dev/null
    echo $? > "$tmp/status"; } | tr '\r' '\n' | sed "s/${esc}\[[0-9;?]*[A-Za-z]//g" \
    | tee "$tmp/out"
else
  { "$docker" pull "$image" 2>&1; echo $? > "$tmp/status"; } | tee "$tmp/out"
fi
code=$(cat "$tmp/status" 2>/dev/null)
if [ "${code:-1}" != 0 ]; then
  # unreachable, or no such image there: the narrow words of vmrun.containers.pull's
  # registry-unreachable and image-not-found (never refused credentials or a bad certificate)
  gone='dial tcp|no such host|connection refused|i/o timeout|TLS handshake timeout'
  gone="$gone|Client\.Timeout exceeded|network is unreachable|name resolution"
  gone="$gone|manifest unknown|manifest for [^ ]+ not found|name unknown|repository does not exist"
  if [ "$policy" = newer ] && [ -n "$had" ] && grep -Eqi "$gone" "$tmp/out"; then
    mark kept "$(grep -Ei "$gone" "$tmp/out" | tail -n 1 | cut -c 1-200)"
    mark image "$had"
    exit 0
  fi
  exit "${code:-1}"
fi
mark image "$(here)"
