#!/bin/sh
# Has an SGLang server load the checkpoint an external trainer just wrote (its
# `/update_weights_from_disk` endpoint), so the next step's rollouts use the new weights:
# specs/sesa.yaml's `update.external.reload_command`. sesa runs it with SESA_CHECKPOINT (a Hugging
# Face directory), SESA_POLICY_VERSION and SESA_MODEL set; it fails the step when the server
# refuses. SGLANG_URL names the server (default: the policy server of specs/sesa.yaml).
set -eu
url="${SGLANG_URL:-http://127.0.0.1:8001}"
response=$(curl --silent --show-error --fail --max-time 600 \
  -H 'Content-Type: application/json' \
  -d "{\"model_path\": \"$SESA_CHECKPOINT\"}" \
  "$url/update_weights_from_disk")
case "$response" in
  *'"success":true'* | *'"success": true'*) echo "policy version $SESA_POLICY_VERSION served from $SESA_CHECKPOINT" ;;
  *) echo "SGLang at $url did not load $SESA_CHECKPOINT: $response" >&2; exit 1 ;;
esac
