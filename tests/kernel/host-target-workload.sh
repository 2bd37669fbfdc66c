# SPDX-License-Identifier: Apache-2.0
# host-target-workload.sh — guest snippet for /work/shared/tools/kernel-initiator/run-guest.sh:
# drives the insitu NVMe/TCP target on the host (127.0.0.1:PORT = 10.0.2.2:PORT in the guest)
# with the stock Linux kernel initiator. Run by tests/test_nvme_tcp.py, which parses the
# KEY=VALUE marker lines this prints.
#
# Env (from run-guest.sh -e):
#   KINIT_NQN, KINIT_PORT      the target under test; namespace 1 is scratch (mkfs'd here),
#                              namespace 2 holds data the host wrote before starting the target
#   KINIT_RESULT_SECTOR/_SECTORS   where desc.bin puts its result object on namespace 2
#   KINIT_NS2_DATA_SECTOR/_BYTES   a region of namespace 2 whose sha256 is printed
#   KINIT_DENY_NQN, KINIT_DENY_PORT (optional) a target that must refuse this host
#   KINIT_FS_MB (16)           total size of the files of the file-system workload
# Files (from run-guest.sh -a): /kinit/files/desc.bin (valid EXEC with a result object),
#   desc-noresult.bin (no result object), desc-range.bin (an extent beyond namespace 2),
#   kv-create.bin, kv-append.bin, kv-attend.bin (KV-cache requests, docs/kv-commands.md).
# Steps: discover, connect, identify, raw write + read back, EXEC via the passthrough ioctl,
# in-storage attention via the passthrough ioctl (its sequence left for the disconnect to
# free), ext4 workload with remount + sha256 verification + fsck, refused connect, disconnect.
# Exit status: 0 when every step passed; the first failed step exits 1 (after cleaning up);
# 3 when every step ran but a content check failed (SOFT_FAILED= lines say which).
set -u
nb=""; nb2=""
PORT=${KINIT_PORT:?KINIT_PORT}
NQN=${KINIT_NQN:?KINIT_NQN}
HOST=${KINIT_HOST_IP:-10.0.2.2}
F=/kinit/files
MNT=/mnt/insitu
FS_MB=${KINIT_FS_MB:-16}

step() { echo; echo "### $*"; }
mark() { echo "$1=$2"; }
cleanup() {
  grep -q " $MNT " /proc/mounts && umount "$MNT"
  for c in /sys/class/nvme/nvme*; do
    [ -e "$c/subsysnqn" ] || continue
    case "$(cat $c/subsysnqn)" in "$NQN"|"${KINIT_DENY_NQN:-}") nvme disconnect -d "$(basename $c)" >/dev/null 2>&1 ;; esac
  done
}
# a check that fails without stopping the workload: the snippet exits 3 at the end
soft_failed=0
soft() { echo "CHECK FAILED: $*"; echo "SOFT_FAILED=$*"; soft_failed=1; }
die() {
  echo "FAILED: $*"; echo "STEP_FAILED=$*"
  echo "--- dmesg (nvme)"; dmesg | grep -iE 'nvme|blk_update|I/O error|EXT4' | tail -30
  cleanup; exit 1
}
# hex of a byte stream on one line (busybox xxd; od as a fallback)
tohex() { if command -v xxd >/dev/null; then xxd -p | tr -d '\n'; else od -An -tx1 -v | tr -d ' \n'; fi; }
# runs an nvme-cli command, prints its output and rc as NAME_OUT / NAME_RC markers
passthru() {
  local name=$1; shift
  local out rc
  out=$("$@" 2>&1); rc=$?
  LAST_OUT=$out
  echo "$out" | sed "s/^/  /"
  mark "${name}_RC" "$rc"
  mark "${name}_OUT" "$(echo "$out" | tr '\n' ' ')"
  return $rc
}
# dword 0 of the last passthru's completion, in hex without 0x.
# nvme-cli 2.3: "IO Command Vendor Specific is Success and result: 0x0000001e";
# older/newer ones: "NVMe command result:0000001e"
last_dw0() { echo "$LAST_OUT" | sed -n 's/.*result: *\(0x\)\{0,1\}\([0-9a-fA-F]\{1,8\}\).*/\2/p' | head -1; }

step "kernel $(uname -r), $(nvme version 2>&1 | head -1)"
mark HOSTNQN "$(cat /etc/nvme/hostnqn)"

# ---------------------------------------------------------------- discovery
step "nvme discover -t tcp -a $HOST -s $PORT"
nvme discover -t tcp -a "$HOST" -s "$PORT" > /tmp/disc.txt 2>&1; rc=$?
sed 's/^/DISC: /' /tmp/disc.txt
[ $rc = 0 ] || die "discover (rc=$rc)"
grep -q "^subnqn: *$NQN\$" /tmp/disc.txt || soft "the discovery log does not list $NQN as a subnqn"
grep -q "^trsvcid: *$PORT\$" /tmp/disc.txt || soft "the discovery log does not list trsvcid $PORT"

# ---------------------------------------------------------------- connect
step "nvme connect -t tcp -a $HOST -s $PORT -n $NQN"
nvme connect -t tcp -a "$HOST" -s "$PORT" -n "$NQN" || die "connect"
CTRL=""; DEV1=""; DEV2=""
for i in $(seq 1 100); do
  for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn 2>/dev/null)" = "$NQN" ] && CTRL=/dev/$(basename $c); done
  for b in /sys/block/nvme*n*; do
    [ -e "$b" ] || continue
    case "$(basename $b)" in *c*) continue ;; esac
    [ "$(cat $b/device/subsysnqn 2>/dev/null)" = "$NQN" ] || continue
    nsid=$(cat $b/nsid 2>/dev/null || basename $b | sed 's/.*n//')
    [ "$nsid" = 1 ] && DEV1=/dev/$(basename $b)
    [ "$nsid" = 2 ] && DEV2=/dev/$(basename $b)
  done
  [ -n "$CTRL" ] && [ -b "$DEV1" ] && [ -b "$DEV2" ] && break; sleep 0.1
done
echo "controller ${CTRL:-none}, ns1 ${DEV1:-none}, ns2 ${DEV2:-none}"
[ -n "$CTRL" ] || die "no controller for $NQN"
[ -b "$DEV1" ] && [ -b "$DEV2" ] || die "namespaces 1 and 2 did not both appear as block devices"
mark CTRL "$CTRL"; mark DEV1 "$DEV1"; mark DEV2 "$DEV2"
nvme list; nvme list-subsys

# ---------------------------------------------------------------- identify
step "nvme id-ctrl $CTRL"
nvme id-ctrl "$CTRL" > /tmp/idctrl.txt 2>&1 || { cat /tmp/idctrl.txt; die "id-ctrl"; }
sed 's/^/IDCTRL: /' /tmp/idctrl.txt
idf() { sed -n "s/^$1 *: *//p" "$2" | head -1 | sed 's/ *$//'; }
mark IDCTRL_SUBNQN "$(idf subnqn /tmp/idctrl.txt)"
mark IDCTRL_MDTS "$(idf mdts /tmp/idctrl.txt)"
mark IDCTRL_NN "$(idf nn /tmp/idctrl.txt)"
mark IDCTRL_MN "$(idf mn /tmp/idctrl.txt)"
for n in 1 2; do
  eval dev=\$DEV$n
  step "nvme id-ns $dev"
  nvme id-ns "$dev" > /tmp/idns$n.txt 2>&1 || { cat /tmp/idns$n.txt; die "id-ns $dev"; }
  sed "s/^/IDNS$n: /" /tmp/idns$n.txt
  mark NS${n}_NSZE "$(idf nsze /tmp/idns$n.txt)"
  mark NS${n}_BYTES "$(blockdev --getsize64 $dev)"
  mark NS${n}_LBS "$(blockdev --getss $dev)"
done

# ---------------------------------------------------------------- raw I/O
step "raw write + read back on $DEV1: 8 MiB at 1 MiB, direct I/O"
dd if=/dev/urandom of=/tmp/pat bs=1M count=8 2>/dev/null
dd if=/tmp/pat of="$DEV1" bs=1M seek=1 oflag=direct conv=fsync 2>&1 | tail -1
[ "${PIPESTATUS[0]}" = 0 ] || die "raw write"
blockdev --flushbufs "$DEV1"; echo 3 > /proc/sys/vm/drop_caches
W=$(sha256sum < /tmp/pat | cut -d' ' -f1)
R=$(dd if="$DEV1" bs=1M skip=1 count=8 iflag=direct 2>/dev/null | sha256sum | cut -d' ' -f1)
echo "written $W"; echo "read    $R"
[ "$W" = "$R" ] || die "raw read-back differs"
mark RAW_RW_OK 1

step "read the host-written region of namespace 2"
DS=${KINIT_NS2_DATA_SECTOR:-2048}; DB=${KINIT_NS2_DATA_BYTES:-1048576}
mark NS2_DATA_SHA256 "$(dd if="$DEV2" bs=512 skip=$DS count=$(( (DB + 511) / 512 )) iflag=direct 2>/dev/null | head -c $DB | sha256sum | cut -d' ' -f1)"

# ---------------------------------------------------------------- EXEC
RS=${KINIT_RESULT_SECTOR:-8192}; RN=${KINIT_RESULT_SECTORS:-8}
step "EXEC (opcode 0x99) crc32c with a result object at sector $RS (+$RN) of namespace 2"
len=$(stat -c %s $F/desc.bin)
passthru EXEC nvme io-passthru "$DEV2" --opcode=0x99 --namespace-id=2 --data-len=$len --write --input-file=$F/desc.bin \
  || die "EXEC failed"
dw0=$(last_dw0)
[ -n "$dw0" ] || die "no command result (dword 0) in the EXEC output"
mark RESULT_DW0 "$dw0"
mark RESULT_HEX "$(dd if="$DEV2" bs=512 skip=$RS count=$RN iflag=direct 2>/dev/null | tohex)"

step "EXEC without a result object (expected: Invalid Field in Command)"
len=$(stat -c %s $F/desc-noresult.bin)
passthru EXEC_NORESULT nvme io-passthru "$DEV2" --opcode=0x99 --namespace-id=2 --data-len=$len --write \
  --input-file=$F/desc-noresult.bin && die "EXEC without a result object succeeded"

step "EXEC with an extent beyond namespace 2 (expected: LBA Out of Range)"
len=$(stat -c %s $F/desc-range.bin)
passthru EXEC_RANGE nvme io-passthru "$DEV2" --opcode=0x99 --namespace-id=2 --data-len=$len --write \
  --input-file=$F/desc-range.bin && die "EXEC with an out-of-range extent succeeded"

# ---------------------------------------------------------------- KV cache
step "in-storage attention (docs/kv-commands.md) through the passthrough ioctl"
kv() {
  local name=$1 opc=$2 file=$3; shift 3
  passthru "$name" nvme io-passthru "$DEV2" --opcode=$opc --namespace-id=2 --data-len=$(stat -c %s $F/$file) \
    --write --input-file=$F/$file "$@"
}
kv KV_CREATE 0xa1 kv-create.bin || die "KV create"
kv KV_APPEND 0x9d kv-append.bin || die "KV append"
mark KV_APPEND_DW0 "$(last_dw0)"
# KV_ATTEND leaves the result under tag 7; KV_RESULT (0xa6, a read) takes it.
kv KV_ATTEND 0xa5 kv-attend.bin --cdw10=7 || die "KV attend"
rlen=$(last_dw0)
[ -n "$rlen" ] || die "no result length (dword 0) in the KV attend output"
rlen=$((0x$rlen))
mark KV_RESULT_LEN $rlen
nvme io-passthru "$DEV2" --opcode=0xa6 --namespace-id=2 --cdw10=7 --data-len=$rlen --read --raw-binary \
  > /tmp/kv-result.bin 2> /tmp/kv-result.err || { cat /tmp/kv-result.err; die "KV result"; }
mark KV_RESULT_HEX "$(tohex < /tmp/kv-result.bin)"
# The sequence is not freed here: it belongs to this controller, so the disconnect frees it.

# ---------------------------------------------------------------- file system
step "ext4 on $DEV1: mkfs, mount, ${FS_MB} MiB of files, remount, verify, fsck"
mkfs.ext4 -q -F "$DEV1" || die "mkfs.ext4"
mkdir -p $MNT
mount -t ext4 "$DEV1" $MNT || die "mount"
i=0
for mb in $(( FS_MB / 2 )) $(( FS_MB / 4 )) $(( FS_MB / 8 )) $(( FS_MB / 8 - 1 )) 1; do
  i=$((i + 1))
  dd if=/dev/urandom of=$MNT/file$i.bin bs=1M count=$mb 2>/dev/null || die "write file$i.bin"
done
# an odd-sized file too
dd if=/dev/urandom of=$MNT/odd.bin bs=1 count=12345 2>/dev/null || die "write odd.bin"
(cd $MNT && sha256sum *.bin > /tmp/sums) || die "sha256 of the written files"
sync || die "sync"
while read -r h f; do mark FS_SHA256 "$f:$h"; done < /tmp/sums
df -k $MNT | tail -1
umount $MNT || die "umount"
echo 3 > /proc/sys/vm/drop_caches
mount -t ext4 "$DEV1" $MNT || die "remount"
(cd $MNT && sha256sum -c /tmp/sums) || die "sha256 after remount"
umount $MNT || die "second umount"
fsck.ext4 -fn "$DEV1"; rc=$?
[ $rc = 0 ] || die "fsck.ext4 -fn (rc=$rc)"
mark FS_OK 1

# ---------------------------------------------------------------- access control
if [ -n "${KINIT_DENY_PORT:-}" ]; then
  step "nvme connect to $KINIT_DENY_NQN on port $KINIT_DENY_PORT (this host is not allowed)"
  nb=$(dmesg | wc -l)
  nvme connect -t tcp -a "$HOST" -s "$KINIT_DENY_PORT" -n "$KINIT_DENY_NQN" > /tmp/deny.txt 2>&1; rc=$?
  cat /tmp/deny.txt
  mark DENY_CONNECT_RC "$rc"
  mark DENY_CONNECT_OUT "$(tr '\n' ' ' < /tmp/deny.txt)"
  mark DENY_DMESG "$(dmesg | tail -n +$((nb + 1)) | grep -i nvme | tr '\n' '|')"
  nb2=$(dmesg | wc -l)
  n=0
  for c in /sys/class/nvme/nvme*; do [ "$(cat $c/subsysnqn 2>/dev/null)" = "$KINIT_DENY_NQN" ] && n=$((n + 1)); done
  mark DENY_CONTROLLERS "$n"
  [ $rc != 0 ] || die "connect to a target that does not allow this host succeeded"
  [ $n = 0 ] || die "a controller of $KINIT_DENY_NQN exists although connect was refused"
fi

# ---------------------------------------------------------------- disconnect
step "nvme disconnect -n $NQN"
nvme disconnect -n "$NQN" || die "disconnect"
for c in /sys/class/nvme/nvme*; do
  [ "$(cat $c/subsysnqn 2>/dev/null)" = "$NQN" ] && die "controller $c still present after disconnect"
done
mark DISCONNECT_OK 1
echo "--- kernel log (without the refused connect's lines)"
dmesg | awk -v a=${nb:-999999} -v b=${nb2:-0} 'NR <= a || NR > b' \
  | grep -iE 'nvme|blk_update|I/O error|EXT4-fs|Buffer I/O' | sed 's/^/KMSG: /'
echo "WORKLOAD COMPLETED"
[ $soft_failed = 0 ] || { echo "WORKLOAD COMPLETED WITH FAILED CHECKS"; exit 3; }
echo "WORKLOAD PASSED"
exit 0
