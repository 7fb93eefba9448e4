#!/usr/bin/env bash
# Who a `make up` cluster's API servers serve: each control-plane machine's API server scraped twice,
# SECONDS apart, and between the two its requests and the seconds it spent executing them by API
# Priority and Fairness flow schema (the client classes: `system-leader-election` the controller
# manager's and scheduler's leases, `system-node-high` and `system-nodes` the kubelets, `probes` /readyz
# and /livez (HAProxy's health checks, the kubelet's), `kube-system-service-accounts` the CNI, kube-proxy
# and CoreDNS, `exempt` system:masters, that is the management side: Cluster API's controllers through
# the cluster's kubeconfig), its own CPU seconds, and the busiest verbs and resources. The figures of
# docs/tcg.md's "Who the old API server serves during a rollout".
#
# Usage: hack/api-clients.sh [SECONDS]   (default 300; run it beside hack/rollout.sh to cover a rollout)
# Environment: STATE_DIR (the plane's, default /var/lib/capi-libvirt/devplane), CLUSTER (demo),
# NAMESPACE (default).
set -euo pipefail
seconds=${1:-300}
state=${STATE_DIR:-/var/lib/capi-libvirt/devplane}
cluster=${CLUSTER:-demo} ns=${NAMESPACE:-default}
export KUBECONFIG=$state/kubeconfig
k() { kubectl -n "$ns" --request-timeout=30s "$@"; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The cluster's admin credentials, kept in the temporary directory (0700) only.
k get secret "$cluster-kubeconfig" -o jsonpath='{.data.value}' | base64 -d >"$work/kubeconfig"
awk '/client-certificate-data:/ {print $2}' "$work/kubeconfig" | base64 -d >"$work/cert.pem"
awk '/client-key-data:/ {print $2}' "$work/kubeconfig" | base64 -d >"$work/key.pem"

addresses=$(for lm in $(k get machines -l "cluster.x-k8s.io/cluster-name=$cluster,cluster.x-k8s.io/control-plane" \
  -o jsonpath='{range .items[*]}{.spec.infrastructureRef.name}{" "}{end}'); do
  k get libvirtmachine "$lm" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}{"\n"}' | awk '{print $1}'
done)
[[ -n $addresses ]] || { echo "no control-plane machine of cluster $ns/$cluster has an address" >&2; exit 1; }

scrape() { # ADDRESS FILE
  curl -sk --max-time 120 --cert "$work/cert.pem" --key "$work/key.pem" "https://$1:6443/metrics" |
    grep -E '^(apiserver_flowcontrol_dispatched_requests_total|apiserver_flowcontrol_request_execution_seconds_sum|apiserver_request_total|process_cpu_seconds_total)' >"$2" ||
    echo "$(date +%T) $1: no metrics" >&2
}
for a in $addresses; do scrape "$a" "$work/$a.before"; done
echo "$(date +%T) scraped $addresses; again in $seconds s"
sleep "$seconds"
for a in $addresses; do scrape "$a" "$work/$a.after"; done

for a in $addresses; do
  [[ -s $work/$a.before && -s $work/$a.after ]] || continue
  echo "== API server $a, $seconds s"
  # Each sample counts negatively from the first scrape and positively from the second.
  { sed 's/^/- /' "$work/$a.before"; sed 's/^/+ /' "$work/$a.after"; } | awk '
    function label(s, name) { return match(s, name "=\"[^\"]*\"") ? substr(s, RSTART + length(name) + 2, RLENGTH - length(name) - 3) : "" }
    { sign = ($1 == "-") ? -1 : 1; v = $NF * sign }
    $2 ~ /^process_cpu_seconds_total/ { cpu += v }
    $2 ~ /^apiserver_flowcontrol_dispatched_requests_total/ { fs = label($2, "flow_schema"); req[fs] += v; total += v }
    $2 ~ /^apiserver_flowcontrol_request_execution_seconds_sum/ { fs = label($2, "flow_schema"); ex[fs] += v; extotal += v }
    $2 ~ /^apiserver_request_total/ { vr = label($2, "verb") " " label($2, "resource") " " label($2, "subresource"); byverb[vr] += v }
    END {
      printf "its CPU as the guest counts it (process_cpu_seconds_total): %.1f s (%.1f core-s/min)\n", cpu, cpu / '"$seconds"' * 60
      printf "%-30s %9s %7s %10s %7s\n", "flow schema", "requests", "share", "executing", "share"
      for (fs in req) if (req[fs] > 0)
        printf "%-30s %9d %6.1f%% %9.1fs %6.1f%%\n", fs, req[fs], 100 * req[fs] / total, ex[fs], extotal ? 100 * ex[fs] / extotal : 0 | "sort -k4 -rn"
      close("sort -k4 -rn")
      printf "%-30s %9d %7s %9.1fs\n", "all", total, "", extotal
      print "busiest verbs and resources:"
      for (vr in byverb) if (byverb[vr] > 0) printf "  %7d  %s\n", byverb[vr], vr | "sort -rn | head -10"
    }'
done
