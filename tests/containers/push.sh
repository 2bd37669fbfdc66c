#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copies an OCI layout's tag to a (loopback, plain-HTTP) registry.
# Usage: push.sh OCIDIR TAG HOST:PORT/NAME:TAG
set -euo pipefail
skopeo copy --quiet --dest-tls-verify=false "oci:$1:$2" "docker://$3"
