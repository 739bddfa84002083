#!/usr/bin/env bash
# `make install`: the binaries, the systemd unit and a commented example configuration in their
# usual places. An existing /etc/vectorlb/vectorlb.toml is kept (the example goes beside it).
#   PREFIX=/usr/local  DESTDIR=  SYSCONFDIR=/etc  BIN_DIR=target/release  (the built binaries)
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${PREFIX:-/usr/local}
SYSCONFDIR=${SYSCONFDIR:-/etc}
DESTDIR=${DESTDIR:-}
BIN_DIR=${BIN_DIR:-target/release}
UNITDIR=${UNITDIR:-/etc/systemd/system}
bindir=$PREFIX/bin
for b in vectorlb vectorlb-tools; do
    [ -x "$BIN_DIR/$b" ] || { echo "install: $BIN_DIR/$b is missing (make build)" >&2; exit 1; }
done
install -d "$DESTDIR$bindir" "$DESTDIR$SYSCONFDIR/vectorlb" "$DESTDIR$UNITDIR" "$DESTDIR$PREFIX/share/doc/vectorlb"
install -m 0755 "$BIN_DIR/vectorlb" "$DESTDIR$bindir/vectorlb"
# The test tools are for test hosts; installed beside the daemon, never run by it.
install -m 0755 "$BIN_DIR/vectorlb-tools" "$DESTDIR$bindir/vectorlb-tools"
sed -e "s|@BINDIR@|$bindir|g" -e "s|@SYSCONFDIR@|$SYSCONFDIR|g" deploy/vectorlb.service > "$DESTDIR$UNITDIR/vectorlb.service"
chmod 0644 "$DESTDIR$UNITDIR/vectorlb.service"
install -m 0644 deploy/vectorlb.toml "$DESTDIR$SYSCONFDIR/vectorlb/vectorlb.toml.example"
if [ ! -e "$DESTDIR$SYSCONFDIR/vectorlb/vectorlb.toml" ]; then
    install -m 0640 deploy/vectorlb.toml "$DESTDIR$SYSCONFDIR/vectorlb/vectorlb.toml"
fi
install -m 0644 docs/operations.md docs/configuration.md docs/metrics.md "$DESTDIR$PREFIX/share/doc/vectorlb/"
if [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
fi
echo "install: $bindir/vectorlb, $UNITDIR/vectorlb.service, $SYSCONFDIR/vectorlb/vectorlb.toml${DESTDIR:+ (under $DESTDIR)}"
