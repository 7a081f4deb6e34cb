#!/usr/bin/env bash
# Start a local Prefect stack without containers: server on 127.0.0.1, work pools, deployments, a CPU
# worker (and a GPU worker per visible GPU when nvidia-smi finds any). State and PIDs under .prefect-local/.
# The API needs a password: a random one is generated on first start and kept OUTSIDE the repository in
# ${XMC_PREFECT_AUTH_FILE:-~/.config/xmc/prefect-auth} (mode 0600); every client here reads it from there
# (export PREFECT_API_AUTH_STRING="$(cat ~/.config/xmc/prefect-auth)" in your own shell).
#   infra/local/start.sh [PORT]        # default port 4200
#   infra/local/stop.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
REPO=$PWD
PORT=${1:-${XMC_PREFECT_PORT:-4200}}
STATE=$REPO/.prefect-local
BIN=${XMC_VENV:-$REPO/.venv}/bin
mkdir -p "$STATE"
export PREFECT_HOME=$STATE/home PREFECT_API_URL=http://127.0.0.1:$PORT/api
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 DVC_NO_ANALYTICS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export XMC_REPO_DIR=$REPO PYTHONPATH=$REPO

AUTH_FILE=${XMC_PREFECT_AUTH_FILE:-${XDG_CONFIG_HOME:-$HOME/.config}/xmc/prefect-auth}
case "$(cd "$(dirname "$AUTH_FILE")" 2>/dev/null && pwd -P)/" in
  "$REPO"/*) echo "XMC_PREFECT_AUTH_FILE must lie outside the repository"; exit 1 ;;
esac
if [ ! -s "$AUTH_FILE" ]; then
  mkdir -p "$(dirname "$AUTH_FILE")"
  (umask 077; printf 'xmc:%s\n' "$("$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))')" >"$AUTH_FILE")
  echo "generated an API password in $AUTH_FILE"
fi
chmod 600 "$AUTH_FILE"
PREFECT_SERVER_API_AUTH_STRING=$(cat "$AUTH_FILE")
export PREFECT_SERVER_API_AUTH_STRING PREFECT_API_AUTH_STRING=$PREFECT_SERVER_API_AUTH_STRING

if [ -f "$STATE/server.pid" ] && kill -0 "$(cat "$STATE/server.pid")" 2>/dev/null; then
  echo "server already running (pid $(cat "$STATE/server.pid"))"
else
  nohup "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" >"$STATE/server.log" 2>&1 &
  echo $! >"$STATE/server.pid"
fi
health() { curl -sf -u "$PREFECT_API_AUTH_STRING" "$PREFECT_API_URL/health" >/dev/null 2>&1; }
for _ in $(seq 1 60); do
  health && break
  sleep 1
done
health || { echo "server did not become healthy; see $STATE/server.log"; exit 1; }
echo "server: http://127.0.0.1:$PORT (UI), API $PREFECT_API_URL"

"$BIN/prefect" work-pool inspect cpu >/dev/null 2>&1 || "$BIN/prefect" work-pool create cpu --type process >/dev/null
"$BIN/prefect" work-pool inspect gpu >/dev/null 2>&1 || \
  "$BIN/prefect" work-pool create gpu --type process --base-job-template infra/work-pools/gpu-process.json >/dev/null
"$BIN/prefect" --no-prompt deploy --all --prefect-file infra/prefect.yaml >"$STATE/deploy.log" 2>&1 || {
  echo "deploy failed; see $STATE/deploy.log"; exit 1; }
echo "deployments: $("$BIN/prefect" deployment ls 2>/dev/null | grep -c '/' || true)"

start_worker() {  # name pool extra-env...
  local name=$1 pool=$2; shift 2
  if [ -f "$STATE/worker-$name.pid" ] && kill -0 "$(cat "$STATE/worker-$name.pid")" 2>/dev/null; then return; fi
  env "$@" nohup "$BIN/prefect" worker start --pool "$pool" --name "$name" --type process ${LIMIT:+--limit $LIMIT} \
    >"$STATE/worker-$name.log" 2>&1 &
  echo $! >"$STATE/worker-$name.pid"
  echo "worker $name on pool $pool (pid $!)"
}
start_worker cpu-0 cpu
if command -v nvidia-smi >/dev/null 2>&1; then
  n=$(nvidia-smi -L 2>/dev/null | wc -l)
  for i in $(seq 0 $((n - 1))); do LIMIT=1 start_worker "gpu-$i" gpu CUDA_VISIBLE_DEVICES=$i; done
fi
echo "stop with: infra/local/stop.sh"
