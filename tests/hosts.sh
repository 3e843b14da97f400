# tests/hosts.sh - two hosts simulated on this machine, for the scripts that run jobs
# across hosts (sourced; needs root and ip). `hosts_up TAG NET` makes the network
# namespaces $h1 and $h2 (TAG-h1, TAG-h2) joined by a veth pair, with the addresses
# $net.1 and $net.2 (NET is three octets; the addresses exist only inside the two
# namespaces) and loopback up; it fails when namespaces cannot be made here.
# `hosts_down` kills whatever runs in them and removes them.
hosts_up() {
  tag=$1 net=$2 h1=$1-h1 h2=$1-h2
  ip netns add "$h1" 2>/dev/null && ip netns add "$h2" && ip link add "$tag-a" type veth peer name "$tag-b" &&
    ip link set "$tag-a" netns "$h1" && ip link set "$tag-b" netns "$h2" &&
    ip -n "$h1" addr add "$net.1/24" dev "$tag-a" && ip -n "$h2" addr add "$net.2/24" dev "$tag-b" &&
    ip -n "$h1" link set "$tag-a" up && ip -n "$h2" link set "$tag-b" up &&
    ip -n "$h1" link set lo up && ip -n "$h2" link set lo up
}
hosts_down() {
  local ns
  for ns in "$h1" "$h2"; do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
