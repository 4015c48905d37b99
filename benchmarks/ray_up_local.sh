#!/usr/bin/env bash
# `ray up clusters/local.yaml` for real, on this one machine: results in docs/ray_up_local.md.
#
#   sudo benchmarks/ray_up_local.sh            # needs root (a user, an sshd), openssh-server and rsync installed:
#                                              # apt-get install -y openssh-server rsync
#
# The "remote host" is a separate unprivileged local user reached over SSH on loopback, key-based auth only (its
# own sshd on 127.0.0.1:22, passwords off, only that user allowed). The cluster file is clusters/local.yaml with
# only what the YAML's header says to edit (head_ip, worker_ips, ssh_user, ssh_private_key) filled in for that host.
# Then, exactly as a user would:
#   ray up     - rsyncs this checkout to ~/agentrl_ray on the host, runs the YAML's setup_commands there (a venv,
#                pip install of the package with its cpu extra: torch, vLLM, Ray, ...), starts the Ray head;
#   ray job submit - trains 2 steps of the default task on that cluster (token auth: the client's token, which
#                `ray up` copied to the host, as the YAML's header says);
#   ray down   - stops Ray on the host.
# Running Ray as another user also keeps the YAML's `ray stop` away from anyone else's Ray on this machine (a
# user cannot signal another user's processes).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
user=${RAYUP_USER:-agentrl_rayup}
home=/home/$user
work=$(mktemp -d /tmp/rayup-XXXXXX)
chmod 755 "$work"
ray_bin=$(dirname "$(command -v python)")/ray
log() { echo "[$(date +%T)] $*"; }

cleanup() {
  # On a failure after `ray up` began, still take the cluster down (over the same sshd), then stop the sshd.
  if [ -n "${up:-}" ] && [ -z "${down:-}" ]; then "$ray_bin" down -y "$work/local.yaml" || true; fi
  if [ -f "$work/sshd.pid" ]; then kill "$(cat "$work/sshd.pid")" 2>/dev/null || true; fi
}
trap cleanup EXIT

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
cat > "$work/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port 22
HostKey $work/host_key
PidFile $work/sshd.pid
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers $user
UsePAM no
EOF
/usr/sbin/sshd -f "$work/sshd_config"
log "sshd on 127.0.0.1:22 for $user (key only)"

# 2. clusters/local.yaml, with this host filled in.
python - "$repo/clusters/local.yaml" "$work/local.yaml" "$user" "$work/id_ed25519" <<'EOF'
import sys, yaml
src, dst, user, key = sys.argv[1:]
config = yaml.safe_load(open(src))
config["provider"].update(head_ip="127.0.0.1", worker_ips=[])
config["auth"] = {"ssh_user": user, "ssh_private_key": key}
config["max_workers"] = 0
yaml.safe_dump(config, open(dst, "w"), sort_keys=False)
EOF
diff <(python -c "import yaml,sys; print(yaml.safe_dump(yaml.safe_load(open('$repo/clusters/local.yaml')), sort_keys=False))") \
  "$work/local.yaml" || true

# The client side ("your laptop"): a home of its own, so the token `ray get-auth-token --generate` writes there (and
# that `ray up` copies to the host, file_mounts) is this cluster's only, not this machine's ~/.ray/auth_token.
export HOME=$work/laptop RAY_AUTH_MODE=token
mkdir -p "$HOME"
"$ray_bin" get-auth-token --generate > /dev/null
cd "$repo"
log "ray up"
up=1
time "$ray_bin" up -y --no-config-cache "$work/local.yaml"
log "ray job submit"
time "$ray_bin" job submit --address http://127.0.0.1:8265 --working-dir . -- \
  "$home/agentrl_venv/bin/agentrl-ray" train examples/calculator/config.yaml \
  run.steps=2 run.eval_every=0 run.eval_at_start=false data.eval_size=16 rollout.prompts_per_step=4 \
  run.output_dir="$home/rayup_runs" run.name=rayup
ls -l "$home/rayup_runs/rayup"
log "ray down"
time "$ray_bin" down -y "$work/local.yaml"
down=1
if pgrep -u "$user" -f raylet >/dev/null; then echo "Ray still runs as $user after ray down" >&2; exit 1; fi
log "done: no Ray process of $user left"
