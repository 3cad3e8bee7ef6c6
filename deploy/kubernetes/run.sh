#!/bin/bash
# Runs the generator across the cluster against the interposed backend and prints the
# merged report: the backend (with its snag sidecar) and the results volume, then the
# generator's two pods set to begin together LEAD seconds from now, then the runner.
#   deploy/kubernetes/run.sh            # kubectl's current context and namespace
#   LEAD=90 deploy/kubernetes/run.sh    # more time for the pods to be scheduled
# Needs the image (scripts/image.sh) where the cluster pulls from, and the Secret:
#   kubectl create secret generic snag-control --from-literal=token=$(openssl rand -hex 16)
set -euo pipefail
cd "$(dirname "$0")"
lead=${LEAD:-60}
kubectl apply -f faults.yaml -f backend.yaml -f results.yaml
kubectl rollout status deployment/snag-backend --timeout=300s
kubectl delete job snag-generator snag-runner --ignore-not-found
at=$(date -u -d "+${lead} seconds" +%Y-%m-%dT%H:%M:%SZ)
sed "s|snag.dev/start-at: .*|snag.dev/start-at: \"$at\"|" generator.yaml | kubectl apply -f -
echo "generator: 2 shards begin at $at"
kubectl wait --for=condition=complete job/snag-generator --timeout=$((lead + 600))s
kubectl apply -f runner.yaml
kubectl wait --for=condition=complete job/snag-runner --timeout=120s
kubectl logs job/snag-runner
