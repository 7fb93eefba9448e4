#!/usr/bin/env bash
# A rollout of a `make up` cluster, measured: `clusterctl alpha rollout restart KIND/NAME`, then until
# every old machine is gone from the API and from libvirt and the replacements are ready and up to
# date: /readyz through the control-plane endpoint every 3 s (5 s timeout), each VM's host CPU every
# 30 s, the machines every 30 s. The figures of docs/upgrades.md and docs/tcg.md.
#
# Usage: hack/rollout.sh kubeadmcontrolplane|machinedeployment NAME [OUT_DIR]
#   e.g. hack/rollout.sh kubeadmcontrolplane demo-control-plane
# Environment: STATE_DIR (the plane's, default /var/lib/capi-libvirt/devplane), CLUSTER (demo),
# NAMESPACE (default), TIMEOUT_MINUTES (90). Touch OUT_DIR/stop to end it early.
set -euo pipefail
kind=$1 name=$2 out=${3:-rollout-$2-$(date +%Y%m%d-%H%M%S)}
state=${STATE_DIR:-/var/lib/capi-libvirt/devplane}
cluster=${CLUSTER:-demo} ns=${NAMESPACE:-default} timeout=$((${TIMEOUT_MINUTES:-90} * 60))
export KUBECONFIG=$state/kubeconfig
bin=$(cd "$(dirname "$0")/.." && pwd)/bin
k() { kubectl -n "$ns" --request-timeout=30s "$@"; }
mkdir -p "$out"

case $kind in
kubeadmcontrolplane) selector=cluster.x-k8s.io/control-plane ;;
machinedeployment) selector=cluster.x-k8s.io/deployment-name=$name ;;
*) echo "kind must be kubeadmcontrolplane or machinedeployment" >&2; exit 2 ;;
esac
selector="cluster.x-k8s.io/cluster-name=$cluster,$selector"
endpoint=$(k get libvirtcluster "$cluster" -o jsonpath='{.spec.controlPlaneEndpoint.host}:{.spec.controlPlaneEndpoint.port}')
old_machines=$(k get machines -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
old_domains=$(for lm in $(k get machines -l "$selector" -o jsonpath='{range .items[*]}{.spec.infrastructureRef.name}{" "}{end}'); do
  k get libvirtmachine "$lm" -o jsonpath='{.status.domain.name}{"\n"}'
done)

# One line per probe: time and HTTP status (000: no answer within 5 s).
probe() {
  while true; do
    echo "$(date +%T) $(curl -sk -o /dev/null -w '%{http_code}' --max-time 5 "https://$endpoint/readyz" || true)"
    sleep 3
  done
}
# One line per 30 s: each QEMU process's host CPU (guest=core-seconds per minute) and the host's.
cpu() {
  declare -A last
  local host_last
  host_last=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat)
  while true; do
    sleep 30
    local line host
    line="$(date +%T)"
    for pid in $(pgrep -f '^/usr/bin/qemu-system' || true); do
      local guest ticks
      guest=$(tr '\0' '\n' </proc/"$pid"/cmdline 2>/dev/null | sed -n '/^-name$/{n;s/^guest=\([^,]*\).*/\1/p;q}') || continue
      ticks=$(awk '{print $14+$15}' /proc/"$pid"/stat 2>/dev/null) || continue
      [ -n "${last[$pid]:-}" ] && line+=" ${guest}=$(awk -v d=$((ticks - last[$pid])) -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", d/hz*2}')"
      last[$pid]=$ticks
    done
    host=$(awk '/^cpu /{print $2+$3+$4+$7+$8+$9}' /proc/stat)
    echo "$line host=$(awk -v d=$((host - host_last)) -v hz="$(getconf CLK_TCK)" 'BEGIN{printf "%.1f", d/hz*2}')"
    host_last=$host
  done
}
probe >"$out/probes" 2>&1 &
probe_pid=$!
cpu >"$out/cpu" 2>&1 &
cpu_pid=$!
trap 'kill $probe_pid $cpu_pid 2>/dev/null || true' EXIT

start=$(date +%s)
echo "$(date +%T) clusterctl alpha rollout restart $kind/$name (endpoint $endpoint; old machines: $(echo $old_machines))" | tee "$out/log"
"$bin/clusterctl" alpha rollout restart "$kind/$name" -n "$ns" | tee -a "$out/log"
while true; do
  sleep 30
  left=0
  for m in $old_machines; do k get machine "$m" >/dev/null 2>&1 && left=$((left + 1)); done
  for d in $old_domains; do virsh -q dominfo "$d" >/dev/null 2>&1 && left=$((left + 1)); done
  if [ "$kind" = kubeadmcontrolplane ]; then
    status=$(k get kcp "$name" -o jsonpath='{.spec.replicas}/{.status.replicas}/{.status.readyReplicas}/{.status.upToDateReplicas}/{.status.availableReplicas}')
  else
    status=$(k get md "$name" -o jsonpath='{.spec.replicas}/{.status.replicas}/{.status.readyReplicas}/{.status.upToDateReplicas}/{.status.availableReplicas}')
  fi
  machines=$(k get machines -l "$selector" -o jsonpath='{range .items[*]}{.metadata.name}={.status.phase}{" "}{end}' 2>&1 || true)
  echo "$(date +%T) +$(($(date +%s) - start))s want/replicas/ready/upToDate/available $status, old machines and domains left $left: $machines" | tee -a "$out/log"
  IFS=/ read -r want have ready current available <<<"$status"
  if [ "$left" = 0 ] && [ "$have" = "$want" ] && [ "$ready" = "$want" ] && [ "$current" = "$want" ] && [ "$available" = "$want" ]; then
    echo "rollout complete after $(($(date +%s) - start)) s" | tee -a "$out/log"
    break
  fi
  if [ -f "$out/stop" ] || [ $(($(date +%s) - start)) -gt "$timeout" ]; then
    echo "rollout NOT complete, stopped after $(($(date +%s) - start)) s" | tee -a "$out/log"
    break
  fi
done
kill $probe_pid $cpu_pid 2>/dev/null || true
trap - EXIT
# The summary: probes answered, the longest time without an answer, and the mean host CPU per VM.
awk '{ n++; t = $1; split(t, a, ":"); s = a[1] * 3600 + a[2] * 60 + a[3]; if (n == 1) { first = s; good = s }
       if ($2 == 200) { ok++; if (s - good > gap) gap = s - good; good = s } }
     END { if (s - good > gap) gap = s - good; printf "endpoint: %d of %d probes answered (%.1f%%), longest gap %d s\n", ok, n, 100 * ok / n, gap }' \
  "$out/probes" | tee -a "$out/log"
awk '{ rows++; for (i = 2; i <= NF; i++) { split($i, kv, "="); sum[kv[1]] += kv[2] } }
     END { for (g in sum) printf "host CPU, mean core-s/min over %d windows: %s %.1f\n", rows, g, sum[g] / rows }' \
  "$out/cpu" | sort | tee -a "$out/log"
