# The supervisor's own SSH key (`train --recover`): it reaches the run's nodes and spares
# with a key made for it, never the user's.
#   sh supervisor_keys.sh make DIR TAG     on the supervisor: DIR/id_ed25519 (0600, made if
#     missing, comment TAG), its public line printed
#   sh supervisor_keys.sh allow TAG LINE   on a node or spare: LINE in ~/.ssh/authorized_keys
#     (once: a line with TAG already there is replaced)
#   sh supervisor_keys.sh forget TAG       every line with TAG out of ~/.ssh/authorized_keys
# TAG is `vmrun-supervisor:RUN_ID`: the key's comment, how its line is found again.
mode=$1 tag=$2
keys=$HOME/.ssh/authorized_keys
drop() {  # the authorized keys without TAG's lines, written in one rename
  [ -f "$keys" ] || return 0
  grep -v -F -- " $tag" "$keys" > "$keys.vmrun-tmp" || true
  chmod 600 "$keys.vmrun-tmp" && mv "$keys.vmrun-tmp" "$keys"
}
case $mode in
  make)
    dir=$3
    mkdir -p "$dir" && chmod 700 "$dir" || exit 1
    if [ ! -f "$dir/id_ed25519" ]; then
      ssh-keygen -q -t ed25519 -N '' -C "$tag" -f "$dir/id_ed25519" < /dev/null || exit 1
    fi
    cat "$dir/id_ed25519.pub"
    ;;
  allow)
    line=$3
    case $line in *"
"*) echo "supervisor_keys.sh: one line only" >&2; exit 2 ;; esac
    mkdir -p "$HOME/.ssh" && chmod 700 "$HOME/.ssh" || exit 1
    drop
    printf '%s\n' "$line" >> "$keys" && chmod 600 "$keys"
    ;;
  forget)
    drop
    ;;
  *) echo "supervisor_keys.sh: unknown mode $mode" >&2; exit 2 ;;
esac
