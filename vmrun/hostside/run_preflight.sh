# What a host offers a run, in one round trip:
#   sh -c SOURCE vmrun-preflight HOST_RECORD [DIR SKIP PATTERN...]
# Prints the home directory, setup's environment record (HOST_RECORD, relative to the home)
# as base64 JSON (an empty line when there is none), and how many GPUs nvidia-smi lists (for
# hosts whose interpreter vmrun.toml names without a setup). With DIR (relative to the home,
# or absolute), then every file under it whose name matches a PATTERN (checkpoints an
# earlier run left there) as `SIZE MTIME RELPATH` NUL-terminated, leaving out folders of
# files already moved aside (.vmrun-stale-*) and run folders results/SKIP (SKIP: a glob of
# run ids, whose files belong to those runs).
printf '%s\n' "$HOME"
base64 -w0 "$HOME/$1" 2>/dev/null
echo
nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true
[ $# -ge 4 ] || exit 0
cd "$HOME" || exit 0
dir=$2 skip=$3
shift 3
[ -d "$dir" ] || exit 0
for p do
  shift
  set -- "$@" -o -name "$p"
done
shift
find "$dir" -type d \( -name '.vmrun-stale-*' -o -path "$dir/results/$skip" \) -prune \
  -o -type f \( "$@" \) -printf '%s %T@ %P\0' 2>/dev/null || true
