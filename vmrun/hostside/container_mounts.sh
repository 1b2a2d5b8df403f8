# The mount sources a host lacks: sh -c SOURCE vmrun-container-mounts PATH...
# Prints each PATH that does not exist, one per line (Docker would create an empty one,
# owned by root, and the run would read nothing from it).
for path in "$@"; do
  [ -e "$path" ] || printf '%s\n' "$path"
done
true
