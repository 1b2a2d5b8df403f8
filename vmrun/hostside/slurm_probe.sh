# slurm_probe.sh WORKDIR: what a submission needs to know about the login node, in one
# round trip: the user (name, uid, gid: a container's --user), the absolute work directory ("{user}" is the login user, a
# relative path is under the home), the Slurm version (its GPU options differ), and the
# record `vmrun setup -C` left in WORKDIR/.vmrun/host.json (base64; its env's python).
w=$1
user=$(id -un) || exit 1
# shellcheck disable=SC2088  # a literal "~", as the user wrote it in vmrun.toml
case $w in
  "~") w=$HOME ;;
  "~/"*) w=$HOME/${w#"~/"} ;;
  /*) ;;
  *) w=$HOME/$w ;;
esac
while :; do
  case $w in
    *"{user}"*) w=${w%%"{user}"*}$user${w#*"{user}"} ;;
    *) break ;;
  esac
done
printf 'user=%s\nhome=%s\nworkdir=%s\n' "$user" "$HOME" "$w"
printf 'uid=%s\ngid=%s\n' "$(id -u)" "$(id -g)"
printf 'setup_record=%s\n' "$(base64 -w0 "$w/.vmrun/host.json" 2>/dev/null)"
if ! command -v sbatch >/dev/null 2>&1; then
  echo "sbatch=missing"
  exit 0
fi
printf 'version=%s\n' "$(sinfo --version 2>/dev/null)"
