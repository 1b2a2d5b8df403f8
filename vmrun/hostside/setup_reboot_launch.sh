#!/bin/sh
# Starts a reboot command detached, after a second, so this command has returned first:
# setsid, because it must outlive this channel (whose process group is killed), and its fds
# closed, so the channel ends at once. Its exit status and output land in files, so a reboot
# command that fails (sudo refusing, no systemd) is reported at once, not after the timeout.
# $1: where its exit status goes, $2: where its output goes, $3: the command (bash, as the
# playbook's scripts are; its rc files are not read: --norc). Prints the host's boot_id
# first: the reboot counts once the host answers with another one.
rc=$1 out=$2 command=$3
cat /proc/sys/kernel/random/boot_id 2>/dev/null || echo
mkdir -p "$(dirname "$rc")" "$(dirname "$out")" && rm -f "$rc" "$out"
# shellcheck disable=SC2016 # the inner script expands its own arguments
setsid -f sh -c 'sleep 1; bash --norc -c "$0" >"$1" 2>&1 </dev/null
  echo $? >"$2.tmp"; mv "$2.tmp" "$2"' "$command" "$out" "$rc" </dev/null >/dev/null 2>&1
