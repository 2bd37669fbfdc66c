#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Debian's docker-registry on loopback, for tests.
# Usage: registry.sh start DIR PORT | registry.sh stop DIR
set -euo pipefail
cmd=$1; dir=$2
case $cmd in
start)
  port=$3; mkdir -p "$dir/storage"
  cat > "$dir/config.yml" <<CFG
version: 0.1
log: {level: error}
storage:
  filesystem: {rootdirectory: $dir/storage}
  delete: {enabled: true}
http: {addr: 127.0.0.1:$port}
CFG
  nohup docker-registry serve "$dir/config.yml" > "$dir/registry.log" 2>&1 &
  echo $! > "$dir/pid"
  for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$port/v2/" >/dev/null 2>&1 && exit 0
    kill -0 "$(cat "$dir/pid")" 2>/dev/null || { cat "$dir/registry.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "docker-registry did not come up on 127.0.0.1:$port" >&2; exit 1;;
stop)
  if [ -f "$dir/pid" ]; then
    pid=$(cat "$dir/pid")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$dir/pid"
  fi;;
*) echo "usage: $0 start DIR PORT | stop DIR" >&2; exit 2;;
esac
