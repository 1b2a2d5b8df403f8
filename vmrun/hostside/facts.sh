#!/bin/sh
# What a host is, read-only, as key=value lines (vmrun.setup.facts parses them).
# $1: setup's state file (remote_paths.SETUP_STATE), sent back base64-encoded.
echo "home=$HOME"
echo "user=$(id -un)"
echo "uid=$(id -u)"
# shellcheck disable=SC1091 # the host's own file, read for ID, VERSION_ID, PRETTY_NAME
if [ -r /etc/os-release ]; then . /etc/os-release; fi
echo "os_id=${ID:-}"
echo "os_release=${VERSION_ID:-}"
echo "os_name=${PRETTY_NAME:-}"
echo "arch=$(uname -m)"
echo "boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null)"
gpus=0
for dev in /sys/bus/pci/devices/*; do
  [ "$(cat "$dev/vendor" 2>/dev/null)" = 0x10de ] || continue
  case "$(cat "$dev/class" 2>/dev/null)" in 0x03*) gpus=$((gpus + 1)) ;; esac
done
if [ "$gpus" = 0 ] && command -v lspci >/dev/null 2>&1; then
  gpus=$(lspci -d 10de: 2>/dev/null | grep -ciE 'vga|3d|display' || true)
fi
echo "gpus=$gpus"
if command -v nvidia-smi >/dev/null 2>&1; then
  out=$(nvidia-smi 2>&1); rc=$?
  echo "smi_rc=$rc"
  echo "smi_first=$(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | head -n1)"
  field() { printf '%s\n' "$out" | sed -n "s/.*$1: *\([0-9.]*\).*/\1/p" | head -n1; }
  echo "cuda_driver=$(field 'CUDA Version')"
  echo "driver=$(field 'Driver Version')"
  if [ "$rc" = 0 ]; then  # the oldest GPU decides which CUDA builds still ship its kernels
    echo "compute_cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null \
      | sort -n | head -n1)"
  fi
else
  echo "smi_rc=127"
fi
if [ "$(id -u)" = 0 ]; then echo "sudo=root"
elif ! command -v sudo >/dev/null 2>&1; then echo "sudo=none"
elif said=$(sudo -n true 2>&1 </dev/null); then echo "sudo=nopasswd"
else echo "sudo=password"; echo "sudo_says=$(printf '%s\n' "$said" | head -n1)"; fi
for tool in python3 rsync curl uv; do
  echo "has_$tool=$(command -v $tool >/dev/null 2>&1 && echo 1 || echo 0)"
done
echo "state=$(base64 -w0 "$1" 2>/dev/null)"
