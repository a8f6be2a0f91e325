#!/bin/bash
# issue-3 benchmark driver (kept with results); run as root
set -uo pipefail
B=/work/shared/bench
export RESULTS=/work/main/bench/results/issue3-2026-11-22
export SCRATCH=/var/tmp/i3/peers DRIVE_SIZE=8G
L=/work/main/target/release/lograid
W=/var/tmp/i3
PORT=10899 URI=nbd://127.0.0.1:10899/vol0
. $B/lib.sh
R=$RESULTS
exec > >(tee -a $R/run.log) 2>&1
spid=""
cpu() { awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }  # ticks
ld() { log "load: $(cat /proc/loadavg)"; }
fsum() { $B/fio_sum.py "$1"; }
fcpu() { python3 -c 'import json,sys;t=open(sys.argv[1]).read();d=json.loads(t[t.index("{"):]);j=d["jobs"][0];print("fio_cpu usr=%.0f%% sys=%.0f%% lat_p50_us=%.1f p99_us=%.1f"%(j["usr_cpu"],j["sys_cpu"],j["write"]["clat_ns"]["percentile"]["50.000000"]/1e3,j["write"]["clat_ns"]["percentile"]["99.000000"]/1e3))' "$1" 2>/dev/null; }
lg_mb() { $L status --json $W/m0.img $W/m1.img $W/m2.img 2>/dev/null | python3 -c 'import json,sys;d=json.load(sys.stdin);print(d["member_bytes_written"],d["counters"]["user_bytes_written"],d["counters"]["relocated_blocks"],d["free_bytes"])'; }
serve() { $L serve $W/m0.img $W/m1.img $W/m2.img --listen 127.0.0.1:$PORT >>$R/serve-$1.log 2>&1 & spid=$!
  for i in $(seq 100); do nbdinfo --size $URI >/dev/null 2>&1 && return 0; sleep 0.1; done; log "server did not come up"; return 1; }
stop() { [ -n "$spid" ] && kill -TERM $spid && wait $spid; spid=""; }
lgcreate() { rm -f $W/m?.img; $L create --parity $1 ${2:+--chunk $2} --size 8G --volume vol0:12G $W/m0.img $W/m1.img $W/m2.img >>$R/create.log 2>&1; }

tests=("mixed512-64k-qd1 512-64k 1 10" "mixed512-64k-qd10 512-64k 10 10" "mixed512-64k-qd100 512-64k 100 10" "rand4k-qd32 4k-4k 32 15")

# --- B on a btrfs stack (same fio options as exp_b_randwrite.sh, per-test runtime)
btrfs_B() { local st=$1; $B/stack.sh up $st >/dev/null 2>&1; . /tmp/bench-peers.stack.$st; export MEMBERS; log "$st MNT=$MNT MEMBERS=$MEMBERS"; local f=$MNT/fio-B.dat
  fio --name=layout --filename=$f --size=2g --rw=write --bs=1M --iodepth=8 --ioengine=libaio --direct=1 --end_fsync=1 >/dev/null; stack_sync $MNT
  for t in "${tests[@]}"; do read -r name bsr qd rt <<<"$t"; ld; out=$R/B-$st-$name.json
    b0=$(members_written_bytes)
    fio --name=$name --filename=$f --size=2g --rw=randwrite --bsrange=$bsr --iodepth=$qd --ioengine=libaio --direct=1 --time_based --runtime=$rt --randrepeat=0 --end_fsync=1 --group_reporting --output-format=json >$out 2>&1
    stack_sync $MNT; b1=$(members_written_bytes); read -r _ _ _ wi wm wb run <<<"$(fsum $out)"
    log "RESULT B $st $name: $wi IOPS $wm MB/s fio_bytes=$wb member_bytes=$((b1-b0)) WA=$(wa $wb $((b1-b0))) $(fcpu $out)"
  done
  rm -f $f; stack_sync $MNT; trim_fs $MNT
  # --- A on the same mount
  ld; $B/exp_a_manyfiles.sh $st $MNT 150 1
  $B/stack.sh down $st; unset MEMBERS; }

# --- B + seq on lograid through fio's nbd engine
lograid_B() { local p=$1 st=lograid-p$1${2:+-c$2}; lgcreate $p ${2:-}; serve $st || return
  fio --name=layout --ioengine=nbd --uri=$URI --size=2g --rw=write --bs=1M --iodepth=8 --end_fsync=1 >/dev/null; stop
  for t in "${tests[@]}"; do read -r name bsr qd rt <<<"$t"; ld; out=$R/B-$st-$name.json
    read -r m0 u0 r0 fr0 <<<"$(lg_mb)"; serve $st; c0=$(cpu $spid)
    fio --name=$name --ioengine=nbd --uri=$URI --size=2g --rw=randwrite --bsrange=$bsr --iodepth=$qd --time_based --runtime=$rt --randrepeat=0 --end_fsync=1 --group_reporting --output-format=json >$out 2>&1
    c1=$(cpu $spid); stop; read -r m1 u1 r1 fr1 <<<"$(lg_mb)"; read -r _ _ _ wi wm wb run <<<"$(fsum $out)"
    log "RESULT B $st $name: $wi IOPS $wm MB/s fio_bytes=$wb user_bytes=$((u1-u0)) member_bytes=$((m1-m0)) WA(member/fio)=$(awk -v a=$wb -v d=$((m1-m0)) 'BEGIN{printf "%.3f",d/a}') relocated_blocks=+$((r1-r0)) free_after=$fr1 server_cpu_s=$(( (c1-c0) ))/100 $(fcpu $out)"
  done
  serve $st; ld
  for rw in write read; do out=$R/S-$st-seq$rw.json; c0=$(cpu $spid)
    fio --name=seq$rw --ioengine=nbd --uri=$URI --size=4g --rw=$rw --bs=1M --iodepth=16 --end_fsync=1 --output-format=json >$out 2>&1
    c1=$(cpu $spid); read -r ri rm rb wi wm wb run <<<"$(fsum $out)"; log "RESULT SEQ $st $rw: read $rm MB/s write $wm MB/s run=$run s server_cpu_s=$((c1-c0))/100"
  done; stop; }

# --- A on ext4 over the attached lograid volume (fresh pool)
lograid_A() { local p=$1 st=lograid-p$1${2:+-c$2}; lgcreate $p ${2:-}; read -r m0 u0 _ _ <<<"$(lg_mb)"; serve $st-A || return
  dev=$($L attach --server nbd://127.0.0.1:$PORT --export vol0 2>>$R/attach.log); log "attached $dev"
  mkfs.ext4 -q $dev && mkdir -p $W/mnt && mount $dev $W/mnt || { log "mkfs/mount failed"; $L detach $dev; stop; return; }
  ld; c0=$(cpu $spid); MEMBERS= $B/exp_a_manyfiles.sh $st $W/mnt 150 1; c1=$(cpu $spid)
  log "lograid server cpu during A: $((c1-c0))/100 s"
  umount $W/mnt; $L detach $dev; stop; read -r m1 u1 r1 _ <<<"$(lg_mb)"
  log "RESULT A $st engine: user_bytes=$((u1-u0)) member_bytes=$((m1-m0)) WA(member/user, incl mkfs+both phases+rm)=$(awk -v a=$((u1-u0)) -v d=$((m1-m0)) 'BEGIN{printf "%.3f",d/a}') relocated=$r1"; }

memory_A() { nbdkit -f --ip-addr=127.0.0.1 --port=$PORT memory 12G & local np=$!; sleep 1
  mkdir -p $W/fmnt $W/mnt; nbdfuse $W/fmnt/nbd nbd://127.0.0.1:$PORT & local fp=$!
  for i in $(seq 50); do [ -s $W/fmnt/nbd ] && break; sleep 0.1; done
  dev=$(losetup -f --show --direct-io=on $W/fmnt/nbd); mkfs.ext4 -q $dev && mount $dev $W/mnt
  ld; MEMBERS= $B/exp_a_manyfiles.sh nbdkit-memory $W/mnt 150 1
  umount $W/mnt; losetup -d $dev; fusermount3 -u $W/fmnt; wait $fp; kill $np; wait $np; }

btrfs_A() { local st=$1; $B/stack.sh up $st >/dev/null 2>&1; . /tmp/bench-peers.stack.$st; export MEMBERS; ld; $B/exp_a_manyfiles.sh $st $MNT 150 2; $B/stack.sh down $st; unset MEMBERS; }
set_dirty_limits $((512<<20)) $((128<<20))
trap 'restore_dirty_limits' EXIT
log "start $(date -u)"; ld
for step in "${@}"; do log "=== $step"; $step; done
log "end $(date -u)"
