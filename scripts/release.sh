#!/usr/bin/env bash
# Cut a release of fleet-limiter: check that the tree, Cargo.toml and CHANGELOG.md agree on the
# version, build the release binary, pack it with its licences and docs, write SHA256SUMS, and
# tag the commit. docs/release.md is the procedure around it.
#
#   scripts/release.sh 0.2.0             # on a clean main: build, pack, checksum, tag v0.2.0
#   scripts/release.sh --dry-run 0.2.0   # everything but the tag; a dirty tree is allowed
#
# Environment: OUT (default dist/) is where the artefacts go; FLEET_LIMITER_RELEASE_BIN packs a
# binary already built instead of building one (the tests use it).
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
  dry_run=1
  shift
fi
version="${1:-}"
fail() { echo "release: $*" >&2; exit 1; }

[ -n "$version" ] || fail "usage: scripts/release.sh [--dry-run] VERSION (e.g. 0.2.0)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "$version is not a version: MAJOR.MINOR.PATCH, e.g. 0.2.0"

crate_version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[ "$crate_version" = "$version" ] \
  || fail "Cargo.toml says version $crate_version, not $version: set package.version = \"$version\" and commit it first"
changelog_line=$(grep -E "^## \[$version\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$" CHANGELOG.md || true)
[ -n "$changelog_line" ] \
  || fail "CHANGELOG.md has no \"## [$version] - YYYY-MM-DD\" section: move the Unreleased entries under one and commit it first"

tag="v$version"
if [ "$dry_run" = 0 ]; then
  [ -z "$(git status --porcelain)" ] || fail "the working tree has uncommitted changes; commit or stash them first"
  ! git rev-parse -q --verify "refs/tags/$tag" >/dev/null || fail "tag $tag exists already"
fi

target=$(rustc -vV | sed -n 's/^host: //p')
name="fleet-limiter-$version-$target"
out="${OUT:-dist}"
mkdir -p "$out"

bin="${FLEET_LIMITER_RELEASE_BIN:-}"
if [ -z "$bin" ]; then
  cargo build --release --locked --bin fleet-limiter
  bin=target/release/fleet-limiter
fi
[ -x "$bin" ] || fail "$bin is not an executable"
"$bin" --version >/dev/null || fail "$bin --version failed"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/$name"
install -m 0755 "$bin" "$stage/$name/fleet-limiter"
cp README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE "$stage/$name/"
cp -R docs deploy "$stage/$name/"
# Reproducible archive: sorted names, one owner, the commit's time.
mtime=$(git log -1 --format=%cI)
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="$mtime" \
  -C "$stage" -czf "$out/$name.tar.gz" "$name"
(cd "$out" && sha256sum "$name.tar.gz" > SHA256SUMS && sha256sum -c --quiet SHA256SUMS)
echo "release: $out/$name.tar.gz"
cat "$out/SHA256SUMS"

if [ "$dry_run" = 0 ]; then
  git tag -a "$tag" -m "fleet-limiter $version"
  echo "release: tagged $tag; push it with: git push origin $tag"
else
  echo "release: dry run, no tag made"
fi
