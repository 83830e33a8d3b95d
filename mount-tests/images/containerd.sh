# A private containerd for the fixture builders (sourced by make_images.sh and
# registry/make_soci.sh): only the content store, images and snapshotters (no CRI, no
# tasks), its root, state and socket in a fresh directory under /tmp (unix socket names
# are limited in length). Sets CTRD_DIR (socket: $CTRD_DIR/c.sock) and CTRD_PID; the
# caller kills the process and removes the directory.
start_containerd() {
  CTRD_DIR=$(mktemp -d /tmp/pkgfs-ctrd.XXXXXX)   # short path: unix socket names are limited
  cat >"$CTRD_DIR/config.toml" <<EOF
version = 2
root = "$CTRD_DIR/root"
state = "$CTRD_DIR/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.restart", "io.containerd.internal.v1.tracing",
  "io.containerd.runtime.v1.linux", "io.containerd.runtime.v2.task",
  "io.containerd.service.v1.tasks-service", "io.containerd.grpc.v1.tasks",
  "io.containerd.monitor.v1.cgroups", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$CTRD_DIR/c.sock"
[ttrpc]
  address = "$CTRD_DIR/c.sock.ttrpc"
EOF
  containerd --config "$CTRD_DIR/config.toml" >"$CTRD_DIR/log" 2>&1 &
  CTRD_PID=$!
  local i
  for i in $(seq 100); do
    [[ -S $CTRD_DIR/c.sock ]] && return 0
    sleep 0.1
  done
  tail -n 20 "$CTRD_DIR/log" >&2
  return 1
}

