#!/usr/bin/env bash
# Installs what paceline needs to build (and, with --test, to run its test suite) on Debian 12.
# Idempotent: every step checks first and says what it does. Must run as root.
set -euo pipefail

want_test=0
for a in "$@"; do
  case "$a" in
    --test) want_test=1 ;;
    *) echo "bootstrap: unknown argument '$a' (valid: --test)" >&2; exit 2 ;;
  esac
done

say() { printf '\033[1mbootstrap:\033[0m %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "bootstrap: paceline loads eBPF programs and installs qdiscs; run as root." >&2
  exit 1
fi

# Build chain: llvm-22 for bpf-linker; iproute2 for tc/ip (the tests and the VM use them).
pkgs=(llvm-22-dev libpolly-22-dev libzstd-dev zlib1g-dev iproute2 pkg-config)
if [ "$want_test" = 1 ]; then
  # The VM harness: qemu under TCG, qboot firmware, a static busybox for the initramfs,
  # cpio to pack it, ethtool for the tests that read offloads.
  pkgs+=(qemu-system-x86 qemu-system-data busybox-static cpio ethtool)
  # tcpdump: the D3 bench's per-response timelines (PLEXP_D3_CAPTURE=1).
  pkgs+=(tcpdump)
  # tshark: the trace tests read `paceline trace --pcap`'s pcapng back, comments included.
  pkgs+=(tshark)
  # promtool and amtool: the deployment tests check and unit-test the alerting rules and the
  # Alertmanager example with them; the prometheus server itself: the privileged test
  # tests/tests/integration/prometheus.rs starts one scraping several agents.
  pkgs+=(prometheus prometheus-alertmanager)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # llvm-22 lives in bookworm-security; a fresh machine's package lists may predate it.
  if ! apt-cache show llvm-22-dev >/dev/null 2>&1 || ! apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/paceline-apt.log 2>&1; then
    apt-get update >/tmp/paceline-apt-update.log 2>&1
    apt-get install -y --no-install-recommends "${missing[@]}" >/tmp/paceline-apt.log 2>&1 || {
      echo "bootstrap: apt-get install failed; see /tmp/paceline-apt.log" >&2; tail -20 /tmp/paceline-apt.log >&2; exit 1; }
  fi
else
  say "Debian packages present"
fi

export PATH="/usr/lib/llvm-22/bin:$HOME/.cargo/bin:$PATH"
export LLVM_SYS_221_PREFIX=/usr/lib/llvm-22

# The eBPF crate builds with the nightly the machine ships plus rust-src (build-std=core).
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  say "adding rust-src to the nightly toolchain"
  rustup component add rust-src --toolchain nightly
else
  say "nightly rust-src present"
fi

# bpf-linker links the eBPF object; version 0.13 built against the system's LLVM 22.
if ! bpf-linker --version 2>/dev/null | grep -q '^bpf-linker 0\.13'; then
  say "building bpf-linker 0.13 against LLVM 22 (about 80 s, once)"
  cargo install bpf-linker --version '^0.13' --locked --no-default-features --features llvm-22 >/tmp/paceline-bpf-linker.log 2>&1 || {
    echo "bootstrap: cargo install bpf-linker failed; see /tmp/paceline-bpf-linker.log" >&2; tail -30 /tmp/paceline-bpf-linker.log >&2; exit 1; }
else
  say "bpf-linker present"
fi

# cargo-fuzz runs the fuzz targets (cargo xtask fuzz; a short seeded run in cargo xtask test).
if [ "$want_test" = 1 ]; then
  if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    say "installing cargo-fuzz 0.13 (about 80 s, once)"
    cargo install cargo-fuzz --version '^0.13' --locked >/tmp/paceline-cargo-fuzz.log 2>&1 || {
      echo "bootstrap: cargo install cargo-fuzz failed; see /tmp/paceline-cargo-fuzz.log" >&2; tail -30 /tmp/paceline-cargo-fuzz.log >&2; exit 1; }
  else
    say "cargo-fuzz present"
  fi
fi

# aya pins maps under a BPF filesystem; make sure one is mounted.
if ! mount | grep -q ' /sys/fs/bpf type bpf'; then
  say "mounting bpffs at /sys/fs/bpf"
  mount -t bpf bpf /sys/fs/bpf
fi
say "ready"
