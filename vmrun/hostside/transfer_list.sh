# sh -c THIS transfer-list ROOT... (vmrun.transfer.manifest): the host's clock, then per
# root a header and its entries, NUL-separated (GNU find -printf). -H follows a root that
# is itself a symlink (the user named it), never links inside.
printf 'T\0%s\0' "$(date +%s)"
for p; do
  printf 'R\0%s\0' "$p"
  if [ -e "$p" ]; then
    find -H "$p" \( -type f -o -type d -o -type l \) \
      -printf '%y\0%s\0%T@\0%m\0%P\0%l\0' || printf 'X\0'
  elif [ -L "$p" ]; then printf 'L\0'
  else printf 'M\0'
  fi
done
