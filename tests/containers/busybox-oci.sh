#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds an OCI image layout of busybox offline: Debian's busybox-static, packed with umoci.
# Usage: busybox-oci.sh OUTDIR [TAG]   (idempotent: an existing OUTDIR:TAG is kept)
set -euo pipefail
out=$1; tag=${2:-latest}
if [ -f "$out/index.json" ] && umoci ls --layout "$out" 2>/dev/null | grep -qx "$tag"; then exit 0; fi
bb=$(command -v busybox)
file -L "$bb" | grep -q "statically linked" || bb=/bin/busybox
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
[ -f "$out/index.json" ] || umoci init --layout "$out"
umoci new --image "$out:$tag"
umoci unpack --image "$out:$tag" "$work/bundle" >/dev/null
root=$work/bundle/rootfs
mkdir -p "$root"/{bin,etc,tmp,root,proc,sys,dev,data}
chmod 1777 "$root/tmp"
cp "$bb" "$root/bin/busybox"
for a in $("$root/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$root/bin/$a"; done
echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
echo 'root:x:0:' > "$root/etc/group"
umoci repack --image "$out:$tag" "$work/bundle" >/dev/null
umoci config --image "$out:$tag" --config.cmd sh --config.env PATH=/bin --config.workingdir / --architecture amd64 --os linux >/dev/null
