#!/usr/bin/env bash
# Who asks what of a `make up` cluster's API servers, by client: an audit log (Metadata level, one line per
# finished request) on each control-plane machine, and a table of its requests by user and user agent
# (the plane's Cluster API controllers are kubernetes-admin with user agent capl-dev), with the seconds
# they took. The figures of docs/tcg.md's "What the plane asks of a joining control plane".
#
# Usage:
#   hack/api-audit.sh on                 turn the audit log on in every control-plane machine now running
#                                        (its API server restarts), through the QEMU guest agent
#   hack/api-audit.sh kcp-patch FILE     write the JSON patch that gives the KubeadmControlPlane the same
#                                        audit log, so machines it creates have it; applying it rolls the
#                                        control plane out, so apply it as the rollout's only trigger:
#                                          kubectl patch kcp demo-control-plane --type=json --patch-file FILE
#   hack/api-audit.sh summary FROM TO    the table of each control-plane machine's requests received
#                                        between FROM and TO (UTC, e.g. 2026-11-30T16:15:34)
# Environment: STATE_DIR (the plane's, default /var/lib/capi-libvirt/devplane), CLUSTER (demo),
# NAMESPACE (default).
set -euo pipefail
state=${STATE_DIR:-/var/lib/capi-libvirt/devplane}
cluster=${CLUSTER:-demo} ns=${NAMESPACE:-default}
export KUBECONFIG=$state/kubeconfig
dir=/var/log/kubernetes/audit
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
k() { kubectl -n "$ns" --request-timeout=30s "$@"; }

policy='apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
'

# The summary, run inside a guest (python3 is there for cloud-init): requests by client, then by client
# and request; a watch counts as one request of 0 s.
summary_py='
import collections, glob, json, re, sys
lo, hi = sys.argv[1], sys.argv[2]
def seconds(t):
    h, m, s = t[11:-1].split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)
clients = collections.defaultdict(lambda: [0, 0.0])
requests = collections.defaultdict(lambda: [0, 0.0])
total = 0
for f in sorted(glob.glob(sys.argv[3] + "/audit*.log")):
    for line in open(f, errors="replace"):
        try:
            e = json.loads(line)
        except ValueError:
            continue
        t = e.get("requestReceivedTimestamp", "")
        if e.get("stage") != "ResponseComplete" or not lo <= t < hi:
            continue
        total += 1
        user = e.get("user", {}).get("username", "")
        user = "system:node:*" if user.startswith("system:node:") else user
        agent = re.sub(r"/v?[0-9][^ ]*", "", e.get("userAgent", "").split(" ")[0])
        verb = "watch" if "watch=true" in e.get("requestURI", "") else e.get("verb", "")
        o = e.get("objectRef") or {}
        what = o.get("resource", "") + ("/" + o["subresource"] if o.get("subresource") else "")
        what = what or e.get("requestURI", "").split("?")[0]
        took = 0.0 if verb == "watch" else seconds(e["stageTimestamp"]) - seconds(t)
        for table, key in ((clients, (user, agent)), (requests, (user, agent, verb, what))):
            table[key][0] += 1
            table[key][1] += took
print(f"{total} requests received between {lo} and {hi}")
print("requests  seconds  client (user, user agent)")
for key, (n, s) in sorted(clients.items(), key=lambda kv: -kv[1][0]):
    print(f"{n:8d} {s:8.1f}  {key[0]}  {key[1]}")
print("requests  seconds  client, verb, resource (the 40 most)")
for key, (n, s) in sorted(requests.items(), key=lambda kv: -kv[1][0])[:40]:
    print(f"{n:8d} {s:8.1f}  {key[0][:30]:30s} {key[1][:24]:24s} {key[2]:7s} {key[3]}")
'

# Runs a command in a guest through the QEMU guest agent (capl-dev exec, of make build).
guest_exec() { # DOMAIN COMMAND... (standard input passed on)
  local d=$1
  shift
  "$bin/capl-dev" --state-dir="$state" exec -i -n "$ns" "$d" -- "$@"
}

domains() {
  for lm in $(k get machines -l "cluster.x-k8s.io/cluster-name=$cluster,cluster.x-k8s.io/control-plane" \
    -o jsonpath='{range .items[*]}{.spec.infrastructureRef.name}{" "}{end}'); do
    k get libvirtmachine "$lm" -o jsonpath='{.status.domain.name}{"\n"}'
  done
}

case ${1:-} in
on)
  for d in $(domains); do
    echo "== $d"
    # The static pod manifest gets the flags and a mount of $dir, where the policy is.
    guest_exec "$d" sh -c "set -e; m=/etc/kubernetes/manifests/kube-apiserver.yaml
      grep -q audit-policy-file \$m && { echo 'already on'; exit 0; }
      mkdir -p $dir; printf '%s' '$policy' >$dir/policy.yaml
      sed -i 's|^    - kube-apiserver\$|    - kube-apiserver\n    - --audit-policy-file=$dir/policy.yaml\n    - --audit-log-path=$dir/audit.log\n    - --audit-log-maxsize=200\n    - --audit-log-maxbackup=3|' \$m
      sed -i 's|^    volumeMounts:\$|    volumeMounts:\n    - mountPath: $dir\n      name: audit|' \$m
      sed -i 's|^  volumes:\$|  volumes:\n  - hostPath:\n      path: $dir\n      type: DirectoryOrCreate\n    name: audit|' \$m
      echo 'on; the API server restarts'" </dev/null
  done
  ;;
kcp-patch)
  # readOnly is explicit: without it KubeadmControlPlane finds the kubeadm-config ConfigMap different
  # from its spec on every reconcile of a rollout and writes it again (nil against false).
  python3 -c 'import json, sys
d = sys.argv[1]
print(json.dumps([
    {"op": "add", "path": "/spec/kubeadmConfigSpec/clusterConfiguration/apiServer", "value": {
        "extraArgs": [{"name": "audit-policy-file", "value": d + "/policy.yaml"}, {"name": "audit-log-path", "value": d + "/audit.log"},
                      {"name": "audit-log-maxsize", "value": "200"}, {"name": "audit-log-maxbackup", "value": "3"}],
        "extraVolumes": [{"name": "audit", "hostPath": d, "mountPath": d, "pathType": "DirectoryOrCreate", "readOnly": False}]}},
    {"op": "add", "path": "/spec/kubeadmConfigSpec/files/-", "value": {"path": d + "/policy.yaml", "owner": "root:root", "permissions": "0644", "content": sys.argv[2]}},
], indent=1))' "$dir" "$policy" >"$2"
  echo "wrote $2"
  ;;
summary)
  for d in $(domains); do
    echo "== $d"
    guest_exec "$d" nice python3 - "$2" "$3" "$dir" <<<"$summary_py"
  done
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  exit 2
  ;;
esac
