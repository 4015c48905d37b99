#!/usr/bin/env bash
# `ray up clusters/local.yaml` for real, on this one machine: results in docs/ray_up_local.md.
#
#   sudo tools/ray_up_local.sh                 # needs root (a user, sshds, network namespaces), iproute2,
#                                              # util-linux (unshare), openssh-server and rsync installed:
#                                              # apt-get install -y openssh-server rsync
#
# Two "remote hosts", reached as a separate unprivileged local user over SSH, key-based auth only (passwords off,
# only that user allowed):
#   head   10.231.0.1: this machine's network, an sshd listening on that address (one end of a veth pair);
#   worker 10.231.0.2: a stand-in for a second machine: its own network namespace (the veth pair's other end, default
#          route back to this machine), its own PID namespace (the YAML's `ray stop` there cannot see the head's
#          processes) and its own /tmp (Ray's session files); it shares /home, as a cluster with NFS homes does.
#          Its sshd runs inside those namespaces, so everything `ray up` runs there over SSH runs inside them too.
# The cluster file is clusters/local.yaml with only what the YAML's header says to edit (head_ip, worker_ips,
# ssh_user, ssh_private_key) filled in for those hosts.
# Then, exactly as a user would:
#   ray up     - rsyncs this checkout to ~/agentrl_ray on the head, runs the YAML's setup_commands there (a venv,
#                pip install of the package with its cpu extra: torch, vLLM, Ray, ...), starts the Ray head; the
#                head's autoscaler then does the same on the worker host and joins it to the cluster;
#   ray job submit - trains 2 steps of the default task on that cluster (token auth: the client's token, which
#                `ray up` copied to the hosts, as the YAML's header says), the learner rank on the worker host (its
#                CPU request does not fit beside the engine on the head) and the engine on the head;
#   ray down   - stops Ray on both hosts.
# Running Ray as another user also keeps the YAML's `ray stop` away from anyone else's Ray on this machine (a
# user cannot signal another user's processes).
set -euo pipefail
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then sed -n '2,26p' "$0" | cut -c3-; exit 0; fi
repo=$(cd "$(dirname "$0")/.." && pwd)
user=${RAYUP_USER:-agentrl_rayup}
home=/home/$user
work=$(mktemp -d /tmp/rayup-XXXXXX)
chmod 755 "$work"
ray_bin=$(dirname "$(command -v python)")/ray
log() { echo "[$(date +%T)] $*"; }

netns=agentrl_rayup_w1
head_ip=10.231.0.1
worker_ip=10.231.0.2
wdir=/run/agentrl_rayup_w1  # the worker host's sshd files: outside /tmp, which is private there

cleanup() {
  # On a failure after `ray up` began, still take the cluster down (over the same sshds), then stop the sshds; the
  # worker host's namespaces die with its sshd (their PID 1).
  if [ -n "${up:-}" ] && [ -z "${down:-}" ]; then "$ray_bin" down -y "$work/local.yaml" || true; fi
  if [ -f "$work/sshd.pid" ]; then kill "$(cat "$work/sshd.pid")" 2>/dev/null || true; fi
  # SIGKILL: unshare --fork outlives a SIGTERM; --kill-child then takes the sshd (PID 1 there) and its namespace.
  if [ -n "${worker_pid:-}" ]; then kill -KILL "$worker_pid" 2>/dev/null || true; wait "$worker_pid" 2>/dev/null || true; fi
  ip netns del "$netns" 2>/dev/null || true
  ip link del agentrl_v0 2>/dev/null || true
  rm -rf "$wdir"
}
trap cleanup EXIT
trap "exit 143" TERM INT  # a killed run still takes the cluster down (EXIT)
# Leftovers of an interrupted run.
ip netns del "$netns" 2>/dev/null || true
ip link del agentrl_v0 2>/dev/null || true

# 1. The host: a user, its key, an sshd on loopback. Its environment: a Ray temp dir of its own (/tmp/ray belongs to
#    whoever started Ray first), the pip index settings of this machine, and the default model already built.
id "$user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user"
usermod -p '*' "$user"  # no password, but not "locked": sshd without PAM refuses locked accounts even with a key
ssh-keygen -q -t ed25519 -N '' -f "$work/id_ed25519"
ssh-keygen -q -t ed25519 -N '' -f "$work/host_key"
install -d -m 700 -o "$user" -g "$user" "$home/.ssh" "$home/.config" "$home/.config/pip" "$home/.cache"
install -m 600 -o "$user" -g "$user" "$work/id_ed25519.pub" "$home/.ssh/authorized_keys"
[ -f /root/.config/pip/pip.conf ] && install -m 644 -o "$user" /root/.config/pip/pip.conf "$home/.config/pip/"
grep -q RAY_TMPDIR "$home/.bashrc" 2>/dev/null || echo "export RAY_TMPDIR=/tmp/ray-$user" >> "$home/.bashrc"
cache=${AGENTRL_CACHE:-$repo/.cache/agentrl_ray}
if [ -d "$cache" ]; then cp -rT "$cache" "$home/.cache/agentrl_ray"; chown -R "$user:$user" "$home/.cache"; fi
mkdir -p /run/sshd
sshd_config() {  # listen address, host key, pid file
  cat <<SSHD
ListenAddress $1
Port 22
HostKey $2
PidFile $3
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers $user
UsePAM no
SSHD
}

# The link between the two hosts: a veth pair, 10.231.0.1 here, 10.231.0.2 in the worker's network namespace, whose
# default route leads back here (so it also reaches the addresses this machine has on other interfaces, which is
# what the head's Ray processes advertise).
ip netns add "$netns"
ip link add agentrl_v0 type veth peer name agentrl_v1
ip link set agentrl_v1 netns "$netns"
ip addr add "$head_ip/24" dev agentrl_v0
ip link set agentrl_v0 up
ip netns exec "$netns" ip addr add "$worker_ip/24" dev agentrl_v1
ip netns exec "$netns" ip link set agentrl_v1 up
ip netns exec "$netns" ip link set lo up
ip netns exec "$netns" ip route add default via "$head_ip"

sshd_config "$head_ip" "$work/host_key" "$work/sshd.pid" > "$work/sshd_config"
/usr/sbin/sshd -f "$work/sshd_config"
log "head host: sshd on $head_ip:22 for $user (key only)"

mkdir -p "$wdir"
ssh-keygen -q -t ed25519 -N '' -f "$wdir/host_key"
sshd_config "$worker_ip" "$wdir/host_key" "$wdir/sshd.pid" > "$wdir/sshd_config"
# The worker host: network namespace, then PID and mount namespaces with a fresh /proc and a private /tmp; its sshd
# (-D: PID 1 there) serves the SSH sessions of `ray up`, which run inside all of them.
ip netns exec "$netns" unshare --pid --fork --kill-child --mount --mount-proc --propagation private \
  sh -c "mount -t tmpfs tmpfs /tmp && exec /usr/sbin/sshd -D -f $wdir/sshd_config" &
worker_pid=$!
for _ in $(seq 50); do ip netns exec "$netns" bash -c "exec 3<>/dev/tcp/$worker_ip/22" 2>/dev/null && break; sleep 0.2; done
log "worker host: sshd on $worker_ip:22 in network, PID and mount namespaces of its own"

# 2. clusters/local.yaml, with this host filled in.
python - "$repo/clusters/local.yaml" "$work/local.yaml" "$user" "$work/id_ed25519" "$head_ip" "$worker_ip" <<'EOF'
import sys, yaml
src, dst, user, key, head, worker = sys.argv[1:]
config = yaml.safe_load(open(src))
config["provider"].update(head_ip=head, worker_ips=[worker])
config["auth"] = {"ssh_user": user, "ssh_private_key": key}
config["max_workers"] = 1
yaml.safe_dump(config, open(dst, "w"), sort_keys=False)
EOF
diff <(python -c "import yaml,sys; print(yaml.safe_dump(yaml.safe_load(open('$repo/clusters/local.yaml')), sort_keys=False))") \
  "$work/local.yaml" || true

# The client side ("your laptop"): a home of its own, so the token `ray get-auth-token --generate` writes there (and
# that `ray up` copies to the host, file_mounts) is this cluster's only, not this machine's ~/.ray/auth_token.
# Autoscaler v1: the v2 autoscaler (the default since Ray 2.50) never launched the local provider's worker here (it
# marked the head instance "no longer found" and kept "Adding 1 nodes" without launching); v1 does.
export HOME=$work/laptop RAY_AUTH_MODE=token RAY_UP_enable_autoscaler_v2=0
mkdir -p "$HOME"
"$ray_bin" get-auth-token --generate > /dev/null
cd "$repo"
log "ray up"
up=1
time timeout 600 "$ray_bin" up -y --no-config-cache "$work/local.yaml"
log "waiting for the worker host to join (the head's autoscaler runs the setup commands there)"
for i in $(seq 90); do
  alive=$("$ray_bin" list nodes --address http://127.0.0.1:8265 -f state=ALIVE --format json 2>/dev/null |
    python -c "import json,sys; print(sorted(n['node_ip'] for n in json.load(sys.stdin)))" 2>/dev/null || true)
  case "$alive" in *"$worker_ip"*) break ;; esac
  if [ "$i" = 90 ]; then echo "the worker host never joined: $alive" >&2; exit 1; fi
  sleep 5
done
log "alive nodes: $alive"
log "ray job submit"
rm -rf "$home/rayup_runs/rayup"
# 1.5 CPUs each: the engine (and its env host) fill the 2-CPU head, the learner rank goes to the worker host.
time "$ray_bin" job submit --address http://127.0.0.1:8265 --working-dir . -- \
  "$home/agentrl_venv/bin/agentrl-ray" train examples/calculator/config.yaml \
  run.steps=2 run.eval_every=0 run.eval_at_start=false data.eval_size=16 rollout.prompts_per_step=4 \
  rollout.num_cpus_per_worker=1.5 learner.num_cpus_per_worker=1.5 \
  run.output_dir="$home/rayup_runs" run.name=rayup
ls -l "$home/rayup_runs/rayup"
python - "$home/rayup_runs/rayup/placement.json" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1]))
print({role: sorted({s["node"][:12] for s in slots}) for role, slots in plan.items() if isinstance(slots, list)})
EOF
log "ray down"
time "$ray_bin" down -y "$work/local.yaml"
down=1
# pgrep here sees the worker host's processes too (its PID namespace is a child of this one).
if pgrep -u "$user" -f raylet >/dev/null; then echo "Ray still runs as $user after ray down" >&2; exit 1; fi
log "done: no Ray process of $user left on either host"
