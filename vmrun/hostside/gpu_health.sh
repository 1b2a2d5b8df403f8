# A host's GPU and network health, as text vmrun.gpus.health reads:
#   sh gpu_health.sh [NVIDIA_SMI]
# `== nvidia-smi -q` then its output (or `== nvidia-smi none` without one, `== nvidia-smi
# failed N` when it fails); `== kernel SOURCE` then the kernel log's NVIDIA lines of the last
# day (SOURCE: journalctl, dmesg, sudo-dmesg; `== kernel unreadable` when none lets this user
# read it); `== rdma` then one line per RDMA device (/sys/class/infiniband: mlx5_0, efa_0...).
smi=${1:-nvidia-smi}
# shellcheck disable=SC2088  # a literal ~/ from vmrun.toml, made $HOME/ here
case $smi in "~/"*) smi="$HOME/${smi#"~/"}" ;; esac
if command -v "$smi" > /dev/null 2>&1; then
  out=$("$smi" -q 2>&1)
  rc=$?
  if [ "$rc" = 0 ]; then
    echo "== nvidia-smi -q"
    printf '%s\n' "$out"
  else
    echo "== nvidia-smi failed $rc"
    printf '%s\n' "$out" | tail -n 3
  fi
else
  echo "== nvidia-smi none"
fi
nvrm() { grep -a 'NVRM' | tail -n 2000; }
if command -v journalctl > /dev/null 2>&1 \
   && log=$(journalctl -k -q --no-pager -o short-iso --since "-24h" 2>/dev/null) \
   && [ -n "$log" ]; then
  echo "== kernel journalctl"
  printf '%s\n' "$log" | nvrm
elif log=$(dmesg -T 2>/dev/null) && [ -n "$log" ]; then
  echo "== kernel dmesg"
  printf '%s\n' "$log" | nvrm
elif [ "$(id -u)" != 0 ] && log=$(sudo -n dmesg -T 2>/dev/null) && [ -n "$log" ]; then
  echo "== kernel sudo-dmesg"
  printf '%s\n' "$log" | nvrm
else
  echo "== kernel unreadable"
fi
echo "== rdma"
for d in /sys/class/infiniband/*; do
  [ -e "$d" ] && echo "${d##*/}"
done
exit 0
