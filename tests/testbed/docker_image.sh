#!/bin/sh
# Build the rootfs tarball of the test bed's container image (tests/testbed/docker.py) into
# OUT_DIR: Debian bookworm (mmdebstrap, variant essential) with python3 and torch from the
# local wheelhouse (the CPU build, pip run from its own wheel inside the chroot: the image
# carries no pip). torch's C++ headers and test binaries are dropped: nothing here compiles.
# Network is needed (the machine's own apt sources, passed to mmdebstrap as they are): .ci/run
# calls this at install time, never a test.
# Usage: docker_image.sh WHEELHOUSE PIP_WHEEL OUT_DIR STAMP
set -eu
wheelhouse=$1 pip_wheel=$2 out=$3 stamp=$4
set --
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] && set -- "$@" "$f"
done
[ "$#" -gt 0 ] || { echo "docker_image.sh: this machine has no apt sources" >&2; exit 1; }
rm -rf "$out" && mkdir -p "$out"
mmdebstrap --mode=root --variant=essential --include=python3,libstdc++6 \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="mkdir -p \"\$1/tmp/wheels\" && cp $wheelhouse/*.whl $pip_wheel \"\$1/tmp/wheels/\"" \
    --customize-hook="env -i PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin chroot \"\$1\" python3 /tmp/wheels/$(basename "$pip_wheel")/pip install \
        --quiet --no-input --no-index --no-cache-dir --break-system-packages \
        --find-links /tmp/wheels torch==2.13.0" \
    --customize-hook='rm -rf "$1/tmp/wheels" "$1"/usr/local/lib/python3*/dist-packages/torch/include \
        "$1"/usr/local/lib/python3*/dist-packages/torch/test \
        "$1"/usr/local/lib/python3*/dist-packages/torch/lib/*_test.so "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    bookworm "$out/rootfs.tar" "$@"
echo "$stamp" >"$out/stamp"
