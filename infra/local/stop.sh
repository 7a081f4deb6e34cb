#!/usr/bin/env bash
# Stop what infra/local/start.sh started, by PID. A worker drains on the first SIGTERM: send a second.
set -uo pipefail
cd "$(dirname "$0")/../.."
STATE=$PWD/.prefect-local
stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null; sleep 2
    kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$f"
}
for f in "$STATE"/worker-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
stop_pid "$STATE/server.pid"
echo "stopped"
