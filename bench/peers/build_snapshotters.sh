#!/usr/bin/env bash
# The two peer remote snapshotters for the benchmark, built from source from the Go
# module proxy (no other network needed):
#
#   bench/peers/build_snapshotters.sh OUTDIR
#
#   OUTDIR/soci-snapshotter-grpc   AWS's SOCI snapshotter daemon: awslabs/soci-snapshotter
#                                  v0.16.1 (root module) + its cmd module at the pinned
#                                  pseudo-version, laid out as in the repository (cmd has
#                                  `replace ../`), cgo + zlib, as mount-tests/registry/
#                                  make_soci.sh builds `soci`; ONE local patch, see below
#   OUTDIR/soci-rpull              a small pull client (written here) for SOCI: containerd
#                                  1.6's `ctr` and stargz's `ctr-remote` cannot pull lazily
#                                  with SOCI, see below
#   OUTDIR/containerd-stargz-grpc  stargz-snapshotter's daemon: a launcher (written here)
#                                  around github.com/containerd/stargz-snapshotter v0.19.1's
#                                  `service` package; upstream's cmd/ module (where the real
#                                  main lives) is not on the module proxy (403 "not
#                                  available" for every version and branch)
#
# Idempotent: OUTDIR/.complete holds a stamp of the pinned versions and of this script;
# when it matches and the binaries are there, nothing is done. Concurrent runs wait on a
# lock. Build time on 2 cores (both builds in parallel): ~6.5 min with an empty Go build
# cache (modules already downloaded; add ~1 min of downloads with an empty module cache),
# ~25 s with a warm build cache.
#
# ---------------------------------------------------------------------------------------
# How each was run and checked here (Debian 12, containerd 1.6.20 from Debian, root). T is
# a short directory under /tmp (unix socket paths are limited to 108 bytes).
#
# Private containerd (CRI etc. disabled as in mount-tests/images/containerd.sh), with the
# peer as a proxy snapshotter -- T/config.toml:
#     version = 2
#     root = "T/ctrd/root"
#     state = "T/ctrd/state"
#     disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.internal.v1.opt",
#       "io.containerd.internal.v1.restart", "io.containerd.internal.v1.tracing",
#       "io.containerd.runtime.v1.linux", "io.containerd.runtime.v2.task",
#       "io.containerd.service.v1.tasks-service", "io.containerd.grpc.v1.tasks",
#       "io.containerd.monitor.v1.cgroups", "io.containerd.snapshotter.v1.btrfs",
#       "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
#       "io.containerd.snapshotter.v1.aufs"]
#     [grpc]
#       address = "T/c.sock"
#     [ttrpc]
#       address = "T/c.sock.ttrpc"
#     [proxy_plugins.stargz]            # for stargz
#       type = "snapshot"
#       address = "T/stargz.sock"
#     [proxy_plugins.soci]              # for SOCI
#       type = "snapshot"
#       address = "T/soci.sock"
#   containerd --config T/config.toml >T/ctrd.log 2>&1 &
#   (`ctr -a T/c.sock plugins ls` then lists io.containerd.snapshotter.v1 stargz / soci ok)
#
# Registry -- T/registry.yml, then `docker-registry serve T/registry.yml &`:
#     version: 0.1
#     log:
#       level: error
#     storage:
#       filesystem:
#         rootdirectory: T/registry
#     http:
#       addr: 127.0.0.1:PORT
#
# stargz (start it before containerd, or containerd retries the socket):
#   T/stargz.toml may be empty (service.Config defaults: prefetch on, background fetch on;
#   for a benchmark without prefetch: `noprefetch = true` and `no_background_fetch = true`;
#   keys as in upstream's config.toml: [blob], [directory_cache], [fuse], [resolver]...)
#   OUTDIR/containerd-stargz-grpc -address T/stargz.sock -root T/stargz-root \
#       -config T/stargz.toml -log-level debug >T/stargz.log 2>&1 &
#   skopeo copy --dest-tls-verify=false --preserve-digests \
#       oci:target/image-fixtures/oci-estargz:latest docker://127.0.0.1:PORT/test/esgz:1
#   ctr-remote -a T/c.sock -n test images rpull --plain-http --snapshotter stargz \
#       127.0.0.1:PORT/test/esgz:1
#   ctr -a T/c.sock -n test snapshots --snapshotter stargz ls     # 3 Committed layers
#   Lazy: T/stargz.log has "prepared remote snapshot" with "remote-snapshot-prepared":"true"
#   for each layer, `mount` shows 3 `stargz on T/stargz-root/snapshotter/snapshots/N/fs type
#   fuse.rawBridge`, and `ctr content ls` holds only the manifest and config (no layer
#   blob); files read through the mounts matched the image (bash, the 4 MiB big.bin).
#   Stop: kill -INT or -TERM the daemon: it closes the snapshotter, which unmounts every
#   FUSE mount (then stop containerd and the registry; the root dir can be removed).
#
# SOCI: needs an image with a SOCI index -- target/soci-fixtures/oci-gzip-soci (SOCI index
#   manifest v2, from `soci convert`). T/soci.toml:
#     [content_store]
#       type = "soci"                     # SOCI's own store under the root dir
#       containerd_address = "T/c.sock"
#   (v0.16 defaults otherwise: pull_modes.soci_v2 on, v1 off, background fetch on -- for a
#   benchmark without it: [background_fetch] disable = true)
#   OUTDIR/soci-snapshotter-grpc --address T/soci.sock --root T/soci-root \
#       --config T/soci.toml --log-level debug >T/soci.log 2>&1 &
#   Push the index byte-exact: skopeo 1.9 drops the `artifactType` of the index entries
#   (and so refuses --preserve-digests on it: "Manifest list must be converted ... but we
#   cannot modify it"); the manifests and blobs keep their digests, so copy them with
#   skopeo and then PUT the original index over the tag:
#   skopeo copy --all --dest-tls-verify=false oci:target/soci-fixtures/oci-gzip-soci \
#       docker://127.0.0.1:PORT/test/soci:1
#   curl -X PUT -H 'Content-Type: application/vnd.oci.image.index.v1+json' \
#       --data-binary @target/soci-fixtures/oci-gzip-soci/blobs/sha256/<index.json's digest> \
#       http://127.0.0.1:PORT/v2/test/soci/manifests/1
#   OUTDIR/soci-rpull -address T/c.sock -namespace test -plain-http 127.0.0.1:PORT/test/soci:1
#   ctr -a T/c.sock -n test snapshots --snapshotter soci ls       # 3 Committed layers
#   Lazy: T/soci.log has "remote snapshot successfully prepared." with
#   "remote-snapshot-prepared":"true" for each layer, `mount` shows 3 `soci on
#   T/soci-root/snapshotter/snapshots/N/fs type fuse.rawBridge`, `ctr content ls` holds
#   only the index, manifest and config; files read through the mounts matched the image.
#   Stop with kill -INT (SOCI unmounts its FUSE mounts on SIGINT only; on SIGTERM it
#   leaves them for a restart -- then `umount T/soci-root/snapshotter/snapshots/*/fs`).
#
# Why soci-rpull: SOCI finds its image, manifest and layer through the snapshot labels
#   containerd.io/snapshot/cri.{image-ref,manifest-digest,layer-digest,image-layers}, which
#   only clients that wrap the pull with containerd's snapshotters.AppendInfoHandlerWrapper
#   add (nerdctl, the CRI plugin; not installed / disabled here). containerd 1.6's `ctr` adds
#   none, `ctr-remote rpull` (stargz 0.12) only stargz's own labels, and soci 0.16's CLI has
#   no `image rpull` any more. soci-rpull is that wrapper plus SOCI's own
#   source.AppendDefaultLabelsHandlerWrapper, as `nerdctl pull --snapshotter soci` and
#   soci's benchmark code do.
# The SOCI patch (cmd/soci-snapshotter-grpc/pkgfs_keynamespace.go + one line of main.go):
#   with Debian's containerd 1.6.20 the first Prepare fails with `failed to prepare
#   extraction snapshot ...: context has no namespace attached` -- Debian's build has no
#   namespace interceptor (upstream containerd copies the request's namespace to the
#   outgoing gRPC metadata, which is how a proxy snapshotter learns it; stargz does not
#   need it, SOCI does). The patch takes the namespace from the snapshot key when none
#   came with the request (containerd names backend snapshots "<ns>/<id>/<key>"); it does
#   nothing when containerd sends the namespace.
# The stargz launcher follows upstream's cmd/containerd-stargz-grpc/main.go: flags
#   -address -config -log-level -root -version, the TOML config (service.Config +
#   metrics_address), the docker-config (and optional kubeconfig) keychain,
#   service.NewStargzSnapshotterService, snapshotsapi.RegisterSnapshotsServer(rpc,
#   snapshotservice.FromSnapshotter(rs)) on a unix socket; it leaves out the FUSE manager
#   (detached mode), IPFS, the bolt metadata store and the CRI keychain, and cleans up on
#   SIGTERM as well as SIGINT (upstream: SIGINT only).
# ---------------------------------------------------------------------------------------
set -euo pipefail

OUT=${1:?usage: build_snapshotters.sh OUTDIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SOCI_ROOT=github.com/awslabs/soci-snapshotter@v0.16.1
SOCI_CMD=github.com/awslabs/soci-snapshotter/cmd@v0.0.0-20260930233240-61147fe7c929
SOCI_VERSION=v0.16.1
STARGZ_MOD=github.com/containerd/stargz-snapshotter
STARGZ_VERSION=v0.19.1
BINS=(soci-snapshotter-grpc soci-rpull containerd-stargz-grpc)

STAMP="pkgfs peer snapshotters v1 $SOCI_ROOT $SOCI_CMD $STARGZ_MOD@$STARGZ_VERSION $(sha256sum <"$HERE/build_snapshotters.sh" | cut -c1-16)"
complete() {
  [[ -f $OUT/.complete && $(<"$OUT/.complete") == "$STAMP" ]] || return 1
  local b
  for b in "${BINS[@]}"; do [[ -x $OUT/$b ]] || return 1; done
}
complete && exit 0
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
exec 9>"$OUT/.lock"
flock 9
complete && exit 0

GO=$(command -v go || true)
[[ -n $GO ]] || GO=/usr/local/go/bin/go
[[ -x $GO ]] || { echo "build_snapshotters.sh: needs Go (and the Go module proxy)" >&2; exit 1; }
export GOFLAGS=${GOFLAGS:--buildvcs=false}
if ! dpkg -s zlib1g-dev >/dev/null 2>&1; then   # SOCI's zTOC code links zlib (cgo)
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zlib1g-dev >/dev/null
fi

WORK=$(mktemp -d /tmp/pkgfs-peers-build.XXXXXX)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
rm -f "$OUT/.complete"
dir_of() { "$GO" mod download -json "$1" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error")))'; }

# ---- SOCI ------------------------------------------------------------------------------
build_soci() {
  local root cmd src=$WORK/soci
  root=$(dir_of "$SOCI_ROOT")
  cmd=$(dir_of "$SOCI_CMD")
  cp -r "$root" "$src"
  chmod -R u+w "$src"
  rm -rf "$src/cmd"
  cp -r "$cmd" "$src/cmd"
  chmod -R u+w "$src/cmd"

  # The namespace patch (see the top of this file).
  local main=$src/cmd/soci-snapshotter-grpc/main.go
  grep -q 'grpc.ChainUnaryInterceptor(unaryNamespaceInterceptor),' "$main" \
    || { echo "build_snapshotters.sh: SOCI main.go changed, cannot apply the namespace patch" >&2; return 1; }
  sed -i 's/grpc.ChainUnaryInterceptor(unaryNamespaceInterceptor),/grpc.ChainUnaryInterceptor(keyNamespaceInterceptor, unaryNamespaceInterceptor),/' "$main"
  cat >"$src/cmd/soci-snapshotter-grpc/pkgfs_keynamespace.go" <<'EOF'
// Added by pkgfs's bench/peers/build_snapshotters.sh (not upstream): containerd passes
// a proxy snapshotter the caller's namespace in the gRPC metadata only if its server
// copies it to the outgoing context (upstream containerd's namespace interceptor);
// Debian 12's containerd 1.6.20 build does not, and SOCI's Prepare then fails with
// "context has no namespace attached". containerd's metadata snapshotter names every
// backend snapshot "<namespace>/<id>/<key>", so when no namespace came with the
// request, take it from the key.
package main

import (
	"context"
	"strings"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"google.golang.org/grpc"
)

func keyNamespaceInterceptor(ctx context.Context, req interface{}, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (interface{}, error) {
	if _, ok := namespaces.Namespace(ctx); !ok {
		var key string
		switch r := req.(type) {
		case *snapshotsapi.UpdateSnapshotRequest:
			key = r.GetInfo().GetName()
		case interface{ GetKey() string }:
			key = r.GetKey()
		}
		if ns, _, ok := strings.Cut(key, "/"); ok && ns != "" {
			ctx = namespaces.WithNamespace(ctx, ns)
		}
	}
	return handler(ctx, req)
}
EOF

  mkdir -p "$src/cmd/soci-rpull"
  cat >"$src/cmd/soci-rpull/main.go" <<'EOF'
// soci-rpull (pkgfs, not upstream): pull an image into containerd with a remote
// snapshotter (default "soci"), passing the snapshot labels the SOCI snapshotter needs
// to mount layers lazily: containerd's image-ref / manifest-digest / layer-digest /
// image-layers labels (snapshotters.AppendInfoHandlerWrapper, as nerdctl and the CRI
// plugin add them) plus SOCI's size / index-digest labels
// (source.AppendDefaultLabelsHandlerWrapper), as `nerdctl pull --snapshotter soci` does.
//
//   soci-rpull [-address SOCK] [-namespace NS] [-snapshotter soci] [-plain-http]
//              [-soci-index-digest DIGEST] REF
package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/awslabs/soci-snapshotter/fs/source"
	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	ctdsnapshotters "github.com/containerd/containerd/v2/pkg/snapshotters"
)

func main() {
	address := flag.String("address", "/run/containerd/containerd.sock", "containerd socket")
	namespace := flag.String("namespace", "default", "containerd namespace")
	snapshotter := flag.String("snapshotter", "soci", "snapshotter to unpack with")
	plainHTTP := flag.Bool("plain-http", false, "talk plain HTTP to the registry (localhost always is)")
	indexDigest := flag.String("soci-index-digest", "", "SOCI index digest (default: the image's own, SOCI index manifest v2)")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: soci-rpull [flags] REF")
		os.Exit(2)
	}
	if err := pull(*address, *namespace, *snapshotter, *plainHTTP, *indexDigest, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "soci-rpull:", err)
		os.Exit(1)
	}
}

func pull(address, namespace, snapshotter string, plainHTTP bool, indexDigest, ref string) error {
	client, err := containerd.New(address)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx := namespaces.WithNamespace(context.Background(), namespace)
	ctx, done, err := client.WithLease(ctx)
	if err != nil {
		return err
	}
	defer done(ctx)
	plain := docker.MatchLocalhost
	if plainHTTP {
		plain = docker.MatchAllHosts
	}
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(plain)),
	})
	img, err := client.Pull(ctx, ref,
		containerd.WithResolver(resolver),
		containerd.WithPullUnpack,
		containerd.WithPullSnapshotter(snapshotter),
		containerd.WithImageHandlerWrapper(source.AppendDefaultLabelsHandlerWrapper(
			indexDigest, ctdsnapshotters.AppendInfoHandlerWrapper(ref))),
	)
	if err != nil {
		return err
	}
	fmt.Printf("%s %s unpacked with %s\n", img.Name(), img.Target().Digest, snapshotter)
	return nil
}
EOF

  local ld="-X github.com/awslabs/soci-snapshotter/version.Version=$SOCI_VERSION -X github.com/awslabs/soci-snapshotter/version.Revision=${SOCI_CMD##*-}+pkgfs-nspatch"
  (cd "$src/cmd" && CGO_ENABLED=1 "$GO" build -ldflags "$ld" -o "$WORK/bin/soci-snapshotter-grpc" ./soci-snapshotter-grpc)
  (cd "$src/cmd" && CGO_ENABLED=1 "$GO" build -o "$WORK/bin/soci-rpull" ./soci-rpull)
}

# ---- stargz ----------------------------------------------------------------------------
build_stargz() {
  local src=$WORK/stargz
  mkdir -p "$src"
  cat >"$src/go.mod" <<EOF
module pkgfs.local/containerd-stargz-grpc

go 1.26.6

require $STARGZ_MOD $STARGZ_VERSION
EOF
  cat >"$src/main.go" <<'EOF'
// containerd-stargz-grpc launcher (pkgfs, not upstream): a minimal stand-in for upstream's
// cmd/containerd-stargz-grpc/main.go (stargz-snapshotter v0.19.1), whose `cmd` module is
// not on the Go module proxy. Same flags (-address -config -log-level -root -version),
// same TOML config (service.Config at top level: [blob], [fuse], [resolver], ...),
// same snapshotter (service.NewStargzSnapshotterService with the docker-config keychain),
// served as containerd's snapshots gRPC API on a unix socket. Not implemented: the FUSE
// manager (detached mode), the IPFS resolver, the bolt metadata store, the CRI keychain
// and systemd notification. On SIGINT or SIGTERM the snapshotter is closed, which
// unmounts every FUSE layer mount (upstream does so on SIGINT only).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	golog "log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/containerd/stargz-snapshotter/service/keychain/keychainconfig"
	"github.com/containerd/stargz-snapshotter/version"
	metrics "github.com/docker/go-metrics"
	toml "github.com/pelletier/go-toml/v2"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
)

const (
	defaultAddress    = "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock"
	defaultConfigPath = "/etc/containerd-stargz-grpc/config.toml"
	defaultRootDir    = "/var/lib/containerd-stargz-grpc"
)

var (
	address      = flag.String("address", defaultAddress, "address for the snapshotter's GRPC server")
	configPath   = flag.String("config", defaultConfigPath, "path to the configuration file")
	logLevel     = flag.String("log-level", "info", "set the logging level [trace, debug, info, warn, error, fatal, panic]")
	rootDir      = flag.String("root", defaultRootDir, "path to the root directory for this snapshotter")
	printVersion = flag.Bool("version", false, "print the version")
)

type snapshotterConfig struct {
	service.Config
	// MetricsAddress is address for the metrics API
	MetricsAddress string `toml:"metrics_address"`
}

func main() {
	flag.Parse()
	if *printVersion {
		fmt.Println("containerd-stargz-grpc", version.Version, version.Revision)
		return
	}
	lvl, err := logrus.ParseLevel(*logLevel)
	if err != nil {
		log.L.WithError(err).Fatal("failed to prepare logger")
	}
	logrus.SetLevel(lvl)
	logrus.SetFormatter(&logrus.JSONFormatter{TimestampFormat: log.RFC3339NanoFixed})
	ctx := log.WithLogger(context.Background(), log.L)
	// go-fuse logs through the standard library logger: stream it into the debug log.
	golog.SetOutput(log.G(ctx).WriterLevel(logrus.DebugLevel))

	var config snapshotterConfig
	if b, err := os.ReadFile(*configPath); err == nil {
		if err := toml.Unmarshal(b, &config); err != nil {
			log.G(ctx).WithError(err).Fatalf("failed to load config file %q", *configPath)
		}
	} else if !(os.IsNotExist(err) && *configPath == defaultConfigPath) {
		log.G(ctx).WithError(err).Fatalf("failed to load config file %q", *configPath)
	}

	if err := service.Supported(*rootDir); err != nil {
		log.G(ctx).WithError(err).Fatalf("snapshotter is not supported")
	}

	rpc := grpc.NewServer()
	credsFuncs, _, err := keychainconfig.ConfigKeychain(ctx, rpc, &keychainconfig.Config{
		EnableKubeKeychain: config.KubeconfigKeychainConfig.EnableKeychain,
		KubeconfigPath:     config.KubeconfigKeychainConfig.KubeconfigPath,
	})
	if err != nil {
		log.G(ctx).WithError(err).Fatalf("failed to configure keychain")
	}
	rs, err := service.NewStargzSnapshotterService(ctx, *rootDir, &config.Config,
		service.WithCredsFuncs(credsFuncs...))
	if err != nil {
		log.G(ctx).WithError(err).Fatalf("failed to configure snapshotter")
	}
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(rs))

	if err := serve(ctx, rpc, *address, config.MetricsAddress); err != nil {
		log.G(ctx).WithError(err).Error("failed to serve snapshotter")
	}
	log.G(ctx).Info("Closing the snapshotter (unmounting layers)")
	rpc.Stop()
	if err := rs.Close(); err != nil {
		log.G(ctx).WithError(err).Warn("failed to close the snapshotter")
	}
	log.G(ctx).Info("Exiting")
}

func serve(ctx context.Context, rpc *grpc.Server, addr, metricsAddr string) error {
	if err := os.MkdirAll(filepath.Dir(addr), 0o700); err != nil {
		return fmt.Errorf("failed to create directory %q: %w", filepath.Dir(addr), err)
	}
	if err := os.RemoveAll(addr); err != nil { // avoid EADDRINUSE
		return fmt.Errorf("failed to remove %q: %w", addr, err)
	}
	errCh := make(chan error, 2)
	if metricsAddr != "" {
		l, err := net.Listen("tcp", metricsAddr)
		if err != nil {
			return fmt.Errorf("failed to get listener for metrics endpoint: %w", err)
		}
		m := http.NewServeMux()
		m.Handle("/metrics", metrics.Handler())
		go func() { errCh <- http.Serve(l, m) }()
	}
	l, err := net.Listen("unix", addr)
	if err != nil {
		return fmt.Errorf("error on listen socket %q: %w", addr, err)
	}
	go func() {
		if err := rpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errCh <- fmt.Errorf("error on serving via socket %q: %w", addr, err)
		}
	}()
	sigCh := make(chan os.Signal, 1)
	signal.Notify(sigCh, unix.SIGINT, unix.SIGTERM)
	select {
	case s := <-sigCh:
		log.G(ctx).Infof("Got %v", s)
		return nil
	case err := <-errCh:
		return err
	}
}
EOF
  local ld="-X $STARGZ_MOD/version.Version=$STARGZ_VERSION -X $STARGZ_MOD/version.Revision=pkgfs-launcher"
  (cd "$src" && "$GO" mod tidy && "$GO" build -ldflags "$ld" -o "$WORK/bin/containerd-stargz-grpc" .)
}

mkdir -p "$WORK/bin"
build_soci >"$WORK/soci.log" 2>&1 &
PIDS+=($!)
build_stargz >"$WORK/stargz.log" 2>&1 &
PIDS+=($!)
fail=0
wait "${PIDS[0]}" || { echo "build_snapshotters.sh: SOCI build failed:" >&2; tail -n 30 "$WORK/soci.log" >&2; fail=1; }
wait "${PIDS[1]}" || { echo "build_snapshotters.sh: stargz build failed:" >&2; tail -n 30 "$WORK/stargz.log" >&2; fail=1; }
PIDS=()
((fail == 0)) || exit 1

for b in "${BINS[@]}"; do
  install -m 0755 "$WORK/bin/$b" "$OUT/.$b.new"
  mv -f "$OUT/.$b.new" "$OUT/$b"
done
echo "$STAMP" >"$OUT/.complete"
