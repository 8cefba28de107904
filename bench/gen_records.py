#!/usr/bin/env python3
"""Fills a ledger directory with COUNT valid, live records, fast (no fsync; run.sh syncs).

    gen_records.py LEDGER_DIR COUNT NETWORK NETNS_PATH CONFLIST [PREFIX]

Each record is exactly what cni-ledger's ADD writes (src/ledger/record.rs):
`{"format":1,"sha256":"<hex of the record bytes>","record":{...}}\n` in
records/<network>:<containerId>:<ifname>.json (file name = key, else "misnamed"), plus
the conflist snapshot the records refer to (locks are byte ranges of one file, locks/keys,
created by the first ADD). The records are live: their netns is NETNS_PATH with its
real device/inode (what src/sandbox.rs compares), this boot's ID, created now.
"""
import fcntl
import hashlib
import json
import struct
import os
import sys
import time


def main():
    if len(sys.argv) not in (6, 7):
        sys.exit(__doc__)
    root, count, network, netns, conflist = sys.argv[1:6]
    prefix = sys.argv[6] if len(sys.argv) == 7 else "live"
    count = int(count)
    st = os.stat(netns)  # follows the path like std::fs::metadata
    ns_id = {"dev": st.st_dev, "ino": st.st_ino}
    fd = os.open(netns, os.O_RDONLY)
    try:
        ns_get_id = (2 << 30) | (8 << 16) | (0xB7 << 8) | 13  # _IOR(0xb7, 13, __u64)
        ns_id["cookie"] = struct.unpack("Q", fcntl.ioctl(fd, ns_get_id, bytes(8)))[0]
    except OSError:
        pass
    finally:
        os.close(fd)
    with open("/proc/sys/kernel/random/boot_id") as f:
        boot = f.read().strip()
    with open(conflist, "rb") as f:
        snap = f.read()
    snap_hash = hashlib.sha256(snap).hexdigest()

    os.umask(0o077)
    for d in ("", "records", "snapshots", "locks", "quarantine"):
        os.makedirs(os.path.join(root, d), mode=0o700, exist_ok=True)
    with open(os.path.join(root, "snapshots", snap_hash + ".json"), "wb") as f:
        f.write(snap)

    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rec_dir = os.path.join(root, "records")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    t0 = time.time_ns()
    for i in range(count):
        cid = f"{prefix}{i:07d}" + "0" * 40  # container IDs are long hex-ish strings
        rec = {
            "network": network,
            "containerId": cid,
            "ifname": "eth0",
            "netns": netns,
            "netnsId": ns_id,
            "bootId": boot,
            "cniArgs": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_NAME=pod-{i}",
            "cniPath": "/usr/lib/cni",
            "cniVersion": "1.0.0",
            "runtimeConfig": {
                "portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]
            },
            "ledgerType": "cni-ledger",
            "snapshot": snap_hash,
            "confFile": conflist,
            "createdAt": created,
            "addId": f"{t0 + i:x}-{os.getpid():x}",
        }
        body = json.dumps(rec, separators=(",", ":")).encode()
        data = (
            b'{"format":1,"sha256":"'
            + hashlib.sha256(body).hexdigest().encode()
            + b'","record":'
            + body
            + b"}\n"
        )
        stem = f"{network}:{cid}:eth0"
        fd = os.open(os.path.join(rec_dir, stem + ".json"), flags, 0o600)
        os.write(fd, data)
        os.close(fd)


if __name__ == "__main__":
    main()
