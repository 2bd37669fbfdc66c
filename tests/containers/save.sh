#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Writes a `docker save` style archive (manifest.json, config, layer tars) of an OCI
# layout's tag, for `docker load` tests.
# Usage: save.sh OCIDIR TAG FILE NAME:TAG
set -euo pipefail
rm -f "$3"
skopeo copy --quiet "oci:$1:$2" "docker-archive:$3:$4"
