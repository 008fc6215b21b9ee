#!/bin/sh
# Has every SGLang server of the policy load the checkpoint an external trainer just wrote (its
# `/update_weights_from_disk` endpoint), so the next step's rollouts use the new weights:
# specs/sesa.yaml's `update.external.reload_command`. sesa runs it with SESA_CHECKPOINT (a Hugging
# Face directory), SESA_POLICY_VERSION, SESA_MODEL and SESA_SERVERS (the model's `base_url`s,
# space-separated) set. It fails the step when any server refuses, naming the servers that did
# load it. SGLANG_URL (space-separated) overrides the servers.
set -eu
servers="${SGLANG_URL:-${SESA_SERVERS:-http://127.0.0.1:8001}}"
done_=""
for server in $servers; do
  url="${server%/}"
  url="${url%/v1}"
  response=$(curl --silent --show-error --fail --max-time 600 \
    -H 'Content-Type: application/json' \
    -d "{\"model_path\": \"$SESA_CHECKPOINT\"}" \
    "$url/update_weights_from_disk") || response="no answer"
  case "$response" in
    *'"success":true'* | *'"success": true'*) echo "$url: policy version $SESA_POLICY_VERSION served from $SESA_CHECKPOINT" ;;
    *) echo "SGLang at $url did not load $SESA_CHECKPOINT: $response${done_:+ (these did: $done_)}" >&2; exit 1 ;;
  esac
  done_="$done_ $url"
done
