#!/usr/bin/env bash
# Fetches Debian's stock kernel (the package linux-image-amd64 depends on) and
# busybox-static, and builds the small initramfs the stock-kernel tests boot:
# busybox, the virtio modules of that same kernel package, and an /init that
# loads them, reads a marker from the virtio disk, gets an address by DHCP
# over virtio-net and pings the gateway, reads the virtio RNG, prints one
# "STOCK <check> ..." line per check and powers off.
#
# No root install: `apt-get download` + `dpkg-deb -x` into a cache folder
# (reused while the package version stays the same). Prints nothing on a
# cache hit. Output, in $STOCK_LINUX_DIR (default ~/.cache/kubevirt-rs/stock-linux):
#   vmlinuz          the packaged bzImage, as installed in /boot
#   initramfs.gz     the initramfs (newc cpio, gzip)
#   version          the package versions and this script's hash (the cache key)
set -euo pipefail

dir=${STOCK_LINUX_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/stock-linux}
mkdir -p "$dir"
script=$(readlink -f "$0")
cd "$dir"

apt_lists_ready() { apt-cache show linux-image-amd64 >/dev/null 2>&1; }
apt_lists_ready || apt-get update -qq
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
kver=$(apt-cache show "$kpkg" | awk '/^Version:/ {print $2; exit}')
bver=$(apt-cache show busybox-static | awk '/^Version:/ {print $2; exit}')
# Rebuilt when a package or this script changes.
want="$kpkg $kver busybox-static $bver script $(sha256sum "$script" | cut -c1-16)"
if [ -s initramfs.gz ] && [ -s vmlinuz ] && [ "$(cat version 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "stock-linux: fetching $kpkg $kver and busybox-static $bver into $dir"
rm -rf pkg root ./*.deb
mkdir pkg root
# apt's sandbox user cannot write here; download as root, quietly.
apt-get download -q -o APT::Sandbox::User=root "$kpkg=$kver" "busybox-static=$bver" >/dev/null
dpkg-deb -x linux-image-*.deb pkg
dpkg-deb -x busybox-static_*.deb pkg
release=${kpkg#linux-image-}
cp "pkg/boot/vmlinuz-$release" vmlinuz

mkdir -p root/bin root/dev root/proc root/sys root/lib/modules root/etc
cp pkg/bin/busybox root/bin/busybox
mods=pkg/lib/modules/$release/kernel
# Dependency order (the package ships no modules.dep: depmod makes it at install).
for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev \
         drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci net/core/failover \
         drivers/net/net_failover drivers/net/virtio_net drivers/block/virtio_blk \
         drivers/char/hw_random/virtio-rng drivers/acpi/button drivers/input/evdev; do
  cp "$mods/$m.ko" root/lib/modules/
done

cat > root/init <<'INIT'
#!/bin/busybox sh
# One "STOCK <check> PASS|FAIL <detail>" line per check, then power off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "STOCK init PASS pid=$$ kernel=$(uname -r)"
ok=0
for m in virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci \
         failover net_failover virtio_net virtio_blk virtio-rng; do
  insmod /lib/modules/$m.ko || ok=1
done
[ $ok = 0 ] && echo "STOCK modules PASS" || echo "STOCK modules FAIL"
# The disk: the first bytes of sector 0 are a marker the test wrote.
for i in $(seq 50); do [ -b /dev/vda ] && break; sleep 0.1; done
marker=$(dd if=/dev/vda bs=64 count=1 2>/dev/null | tr -d '\000')
[ -n "$marker" ] && echo "STOCK disk PASS marker=$marker" || echo "STOCK disk FAIL no /dev/vda"
# The network: DHCP from the host's server, then the gateway answers.
ip link set lo up
ip link set eth0 up
lease=$(udhcpc -i eth0 -n -q -t 5 -T 2 -s /udhcpc.sh 2>&1 | tail -1)
addr=$(ip -4 -o addr show eth0 | awk '{print $4}')
[ -n "$addr" ] && echo "STOCK dhcp PASS addr=$addr" || echo "STOCK dhcp FAIL $lease"
gw=$(ip route | awk '/^default/ {print $3}')
ping -c 1 -W 5 "$gw" >/dev/null 2>&1 && echo "STOCK gateway PASS $gw" || echo "STOCK gateway FAIL gw=$gw"
# The RNG: the virtio device is the current hw_random source.
cur=$(cat /sys/class/misc/hw_random/rng_current 2>/dev/null)
bytes=$(dd if=/dev/hwrng bs=16 count=1 2>/dev/null | od -An -tx1 | tr -d ' \n')
case "$cur" in virtio*) [ ${#bytes} = 32 ] && echo "STOCK rng PASS $cur $bytes" || echo "STOCK rng FAIL read $bytes";;
  *) echo "STOCK rng FAIL current=$cur";; esac
echo "STOCK done"
# stock.wait on the command line: stay up until the ACPI power button (a
# graceful shutdown: the launcher's ShutdownVirtualMachine), then power off.
if grep -q stock.wait /proc/cmdline; then
  insmod /lib/modules/button.ko
  insmod /lib/modules/evdev.ko
  acpid -c /etc/acpi -a /etc/acpid.conf
  echo "STOCK waiting for the power button"
  while :; do sleep 3600; done
fi
poweroff -f
INIT
mkdir -p root/etc/acpi/PWRF
# busybox acpid: the power button's event runs /etc/acpi/PWRF/00000080.
printf 'PWRF PWRF/00000080\n' > root/etc/acpid.conf
printf '#!/bin/sh\necho "STOCK power button: powering off"\npoweroff -f\n' > root/etc/acpi/PWRF/00000080
chmod +x root/etc/acpi/PWRF/00000080
cat > root/udhcpc.sh <<'DHCP'
#!/bin/sh
# udhcpc's hook: configure the lease.
case "$1" in
  bound|renew)
    ip addr flush dev "$interface"
    ip addr add "$ip/${mask:-24}" dev "$interface"
    for r in $router; do ip route add default via "$r" dev "$interface"; break; done
    echo "lease $ip/$mask router $router";;
esac
DHCP
chmod +x root/init root/udhcpc.sh
(cd root && find . | cpio -o -H newc --quiet | gzip -9) > initramfs.gz
echo "$want" > version
rm -rf pkg root ./*.deb
echo "stock-linux: $dir/vmlinuz and $dir/initramfs.gz ready ($kpkg $kver)"
