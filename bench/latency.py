#!/usr/bin/env python3
"""bench/latency.py — per-request latency through the mount under a mixed load, intact and
gocryptfs side by side in the same run (issue 14).

    bench/latency.py [--secs 30] [--procs 4] [--systems intact-mt-eint,gocryptfs]
                     [--dbench] [--out FILE]

Needs root (FUSE), gocryptfs and fuse3 (apt), dbench for --dbench, and a release build of
intact (INTACT_BIN, default /work/target-rel/release/intact, then target/release/intact).

For each system, a fresh volume in BENCH_DIR (default /var/tmp/intact-latency) is mounted and
loaded for --secs seconds by:
  * --procs "mixed" processes, each looping over small-file requests on its own directory:
    create + write 4 KiB + close, read a file back, stat, rename, readdir, unlink, and every
    20th iteration an append of 64 KiB + fsync of that file. Each system call is timed.
  * one "bulk" process writing 1 MiB chunks to a large file without fsync, so that the
    engine reaches its dirty limit and commits while the mixed load runs.
The table gives p50, p99, p99.9 and max of the mixed requests (the ones that must never wait
behind a commit), the bulk writes' own max, and fsync's p50 and p99. The timed region ends
with `sync -f` + fsync of the mount's root directory (durable), reported as "drain".
With --dbench, `dbench -t SECS 4` runs on each mount too: throughput and Flush latency.
With --xattr, N set-then-get pairs of extended attributes on one file (N = 1k, 2k, 4k, 8k),
timed per N: linear means a flat cost per pair (intact is mounted with a limit that lets
8k attributes fit; gocryptfs stores them in the backing ext4, whose limit may stop it). The
names are "user." and two printable characters, so that 8k of them fit in the 64 KiB a
listxattr can return. Then stress-ng's xattr stressor, 10 s per row. Its bogo op sets
"user.var_N" attributes until the file system refuses one, then replaces, reads, lists and
removes them all, so its ops/s depend on how many attributes a file holds: each row gives
that count (probed first) and attributes per second (ops/s x count). The last row mounts
intact with --xattr-max-bytes set to hold as many as gocryptfs's backing ext4 does: the same
work per bogo op, the ratio to compare. --no-mixed skips the mixed load.
"""
import argparse
import os
import random
import shutil
import subprocess
import sys
import time
import multiprocessing as mp

PW = "intact-latency-password"
# The bulk writer goes back to offset 0 past this many bytes (BULK_WRAP_MB, default 1024):
# past it, its writes overwrite sealed data (journaled) instead of appending.
BULK_WRAP = int(os.environ.get("BULK_WRAP_MB", "1024")) << 20


def intact_bin():
    for p in [os.environ.get("INTACT_BIN"), "/work/target-rel/release/intact",
              os.path.join(os.path.dirname(__file__), "..", "target", "release", "intact")]:
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    sys.exit("no release build of intact: cargo build --release -p intact (or INTACT_BIN)")


def is_mounted(mnt):
    with open("/proc/self/mountinfo") as f:
        return any(line.split(" ")[4] == mnt for line in f)


def wait_mounted(mnt, proc=None, timeout=60):
    t = time.time()
    while not is_mounted(mnt):
        if proc is not None and proc.poll() is not None:
            sys.exit(f"mount of {mnt} exited with {proc.returncode}")
        if time.time() - t > timeout:
            sys.exit(f"{mnt} did not mount")
        time.sleep(0.05)


def mount(system, base, extra=()):
    """Mounts a fresh volume of `system`; returns (mountpoint, unmount function)."""
    root = os.path.join(base, system)
    cipher, mnt, state = (os.path.join(root, d) for d in ("cipher", "mnt", "state"))
    # A previous run's daemon may still be exiting (its files busy): unmount, retry.
    for _ in range(100):
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL)
        shutil.rmtree(root, ignore_errors=True)
        if not os.path.exists(root):
            break
        time.sleep(0.1)
    for d in (cipher, mnt, state):
        os.makedirs(d)
    # Each system starts on a quiet disk: what the system before it left dirty (gocryptfs
    # syncs nothing at unmount, so its bulk file's GiB is written back later) and the
    # removal above are written out first, not during this system's run.
    os.sync()
    env = dict(os.environ, INTACT_PASSWORD=PW)
    if system.startswith("intact-"):
        b = intact_bin()
        scheme = system[len("intact-"):]
        subprocess.run([b, "--state", state, "init", cipher, "--scheme", scheme],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        extra = (*extra, *os.environ.get("INTACT_MOUNT_ARGS", "").split())
        subprocess.run([b, "--state", state, "mount", cipher, mnt, *extra], env=env,
                       check=True, stdout=subprocess.DEVNULL)
    elif system == "gocryptfs":
        pwf = os.path.join(root, "pw")
        with open(pwf, "w") as f:
            f.write(PW + "\n")
        subprocess.run(["gocryptfs", "-init", "-q", "-passfile", pwf, cipher], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run(["gocryptfs", "-q", "-passfile", pwf, cipher, mnt], check=True)
    else:
        sys.exit(f"unknown system {system}")
    wait_mounted(mnt)

    def unmount():
        if system.startswith("intact-"):
            # Waits for the daemon to seal and exit, so that the next mount() can remove
            # this volume without racing the daemon's last writes.
            subprocess.run([intact_bin(), "--state", state, "umount", mnt], env=env,
                           check=True)
            return
        for _ in range(200):
            if subprocess.run(["fusermount3", "-u", mnt], stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.1)
        while is_mounted(mnt):
            time.sleep(0.1)
    return mnt, unmount


def timed(lat, op, f, *a):
    t = time.perf_counter_ns()
    r = f(*a)
    lat.append((op, time.perf_counter_ns() - t))
    return r


def mixed(mnt, k, stop_at, q):
    rnd = random.Random(k)
    d = os.path.join(mnt, f"mixed{k}")
    os.makedirs(d, exist_ok=True)
    lat = []
    data = os.urandom(4096)
    big = os.urandom(65536)
    names = []
    n = 0
    log = os.path.join(d, "log")
    while time.time() < stop_at:
        n += 1
        name = os.path.join(d, f"f{n}")

        def create(p=name):
            fd = os.open(p, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.close(fd)
        timed(lat, "create", create)
        names.append(name)
        p = rnd.choice(names)

        def read(p=p):
            with open(p, "rb") as f:
                f.read()
        timed(lat, "read", read)
        timed(lat, "stat", os.stat, rnd.choice(names))
        if len(names) > 50:
            victim = names.pop(rnd.randrange(len(names)))
            new = victim + "r"
            timed(lat, "rename", os.rename, victim, new)
            timed(lat, "unlink", os.unlink, new)
        timed(lat, "readdir", os.listdir, d)
        if n % 20 == 0:
            fd = os.open(log, os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o644)
            timed(lat, "append", os.write, fd, big)
            timed(lat, "fsync", os.fsync, fd)
            os.close(fd)
    q.put(lat)


def bulk(mnt, stop_at, q):
    lat = []
    chunk = os.urandom(1 << 20)
    fd = os.open(os.path.join(mnt, "bulk"), os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
    off = 0
    while time.time() < stop_at:
        timed(lat, "bulk", os.pwrite, fd, chunk, off)
        off = (off + len(chunk)) % BULK_WRAP
    os.close(fd)
    q.put(lat)


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100.0 * len(xs)))]


def run(system, base, secs, procs):
    mnt, unmount = mount(system, base)
    q = mp.Queue()
    stop_at = time.time() + secs
    ps = [mp.Process(target=mixed, args=(mnt, k, stop_at, q)) for k in range(procs)]
    ps.append(mp.Process(target=bulk, args=(mnt, stop_at, q)))
    for p in ps:
        p.start()
    lats = [q.get() for _ in ps]
    for p in ps:
        p.join()
    t = time.perf_counter()
    subprocess.run(["sync", "-f", mnt], check=True)
    fd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    drain = time.perf_counter() - t
    unmount()
    allops = [x for l in lats for x in l]
    mixed_ns = [ns for op, ns in allops if op not in ("bulk", "fsync")]
    fsync_ns = [ns for op, ns in allops if op == "fsync"]
    bulk_ns = [ns for op, ns in allops if op == "bulk"]
    ms = 1e-6
    if os.environ.get("LATENCY_BY_OP"):
        for op in sorted({o for o, _ in allops}):
            xs = [ns for o, ns in allops if o == op]
            print(f"  {system} {op:8} n={len(xs):6} p50={pct(xs, 50) * ms:8.2f} "
                  f"p99={pct(xs, 99) * ms:8.2f} max={max(xs) * ms:8.2f} ms", file=sys.stderr)
    return {
        "system": system, "requests": len(mixed_ns),
        "p50": pct(mixed_ns, 50) * ms, "p99": pct(mixed_ns, 99) * ms,
        "p99.9": pct(mixed_ns, 99.9) * ms, "max": max(mixed_ns, default=0) * ms,
        "fsync p50": pct(fsync_ns, 50) * ms, "fsync p99": pct(fsync_ns, 99) * ms,
        "bulk MB/s": len(bulk_ns) * 1.048576 / secs, "bulk max": max(bulk_ns, default=0) * ms,
        "drain s": drain,
    }


def dbench(system, base, secs):
    mnt, unmount = mount(system, base)
    out = subprocess.run(["dbench", "-D", mnt, "-t", str(secs), "4"], capture_output=True,
                         text=True).stdout
    unmount()
    tput, flush = float("nan"), (float("nan"), float("nan"))
    for line in out.splitlines():
        w = line.split()
        if line.startswith("Throughput"):
            tput = float(w[1])
        if w and w[0] == "Flush" and len(w) >= 4:
            flush = (float(w[2]), float(w[3]))
    return {"system": system, "MB/s": tput, "Flush avg ms": flush[0], "Flush max ms": flush[1]}


def xattrs(system, base):
    extra = ("--xattr-max-bytes", str(64 << 20)) if system.startswith("intact-") else ()
    mnt, unmount = mount(system, base, extra)
    row = {"system": system}
    for n in (1000, 2000, 4000, 8000):
        p = os.path.join(mnt, f"x{n}")
        open(p, "w").close()
        t = time.perf_counter()
        done = n
        for i in range(n):
            name = "user." + chr(0x21 + i // 94) + chr(0x21 + i % 94)
            try:
                os.setxattr(p, name, b"v" * 16)
            except OSError:
                done = i
                break
            assert os.getxattr(p, name) == b"v" * 16
        dt = time.perf_counter() - t
        row[f"{n}: s"] = f"{dt:.3f}" + ("" if done == n else f" (stopped at {done})")
        row[f"{n}: us/pair"] = dt / max(done, 1) * 1e6
    unmount()
    return row


def stressor_names(i):
    """The attribute stress-ng's xattr stressor sets i-th (name, value)."""
    return f"user.var_{i}", f"orig-value-{i}".encode()


def xattr_capacity(mnt):
    """How many of the stressor's attributes one file on `mnt` holds (at most 4096)."""
    p = os.path.join(mnt, "capacity-probe")
    open(p, "w").close()
    n = 0
    while n < 4096:
        try:
            os.setxattr(p, *stressor_names(n))
        except OSError:
            break
        n += 1
    os.unlink(p)
    return n


def stress_xattr(system, base, extra=(), label=None, secs=10):
    mnt, unmount = mount(system, base, extra)
    count = xattr_capacity(mnt)
    out = subprocess.run(["stress-ng", "--xattr", "1", "--timeout", f"{secs}s",
                          "--metrics-brief", "--temp-path", mnt],
                         capture_output=True, text=True)
    unmount()
    rate = None
    for line in (out.stdout + out.stderr).splitlines():
        w = line.split()
        if "metrc:" in w and "xattr" in w:
            rate = float(w[w.index("xattr") + 5])  # bogo ops/s (real time)
    if rate is None or out.returncode != 0:
        sys.exit(f"stress-ng --xattr on {system} failed:\n{out.stdout}{out.stderr}")
    return {"system": label or system, "attrs per op": count, "bogo ops/s": rate,
            "attrs/s": rate * count}


def matched_limit(count):
    """An intact --xattr-max-bytes that holds exactly `count` of the stressor's attributes."""
    return sum(len(n) + len(v) for n, v in map(stressor_names, range(count + 1))) - 1


def table(rows, cols):
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [r[c] if isinstance(r[c], str) else
                 (f"{r[c]:.2f}" if isinstance(r[c], float) else str(r[c])) for c in cols]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--secs", type=int, default=30)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--systems", default="intact-mt-eint,gocryptfs")
    ap.add_argument("--dbench", action="store_true")
    ap.add_argument("--xattr", action="store_true")
    ap.add_argument("--no-mixed", action="store_true")
    ap.add_argument("--out")
    a = ap.parse_args()
    base = os.environ.get("BENCH_DIR", "/var/tmp/intact-latency")
    os.makedirs(base, exist_ok=True)
    text = ""
    if not a.no_mixed:
        rows = [run(s, base, a.secs, a.procs) for s in a.systems.split(",")]
        text = (f"Mixed load: {a.procs} processes + 1 bulk writer, {a.secs} s; "
                "latencies in ms\n\n"
                + table(rows, ["system", "requests", "p50", "p99", "p99.9", "max",
                               "fsync p50", "fsync p99", "bulk MB/s", "bulk max", "drain s"]))
    if a.dbench:
        drows = [dbench(s, base, a.secs) for s in a.systems.split(",")]
        text += "\n\ndbench, 4 clients, %d s\n\n" % a.secs + table(
            drows, ["system", "MB/s", "Flush avg ms", "Flush max ms"])
    if a.xattr:
        xrows = [xattrs(s, base) for s in a.systems.split(",")]
        cols = ["system"] + [f"{n}: {u}" for n in (1000, 2000, 4000, 8000)
                             for u in ("s", "us/pair")]
        text += "\n\nxattr set-then-get on one file\n\n" + table(xrows, cols)
        srows = [stress_xattr(s, base) for s in a.systems.split(",")]
        goc = [r for r in srows if r["system"] == "gocryptfs"]
        for s in a.systems.split(","):
            if goc and s.startswith("intact-"):
                n = goc[0]["attrs per op"]
                r = stress_xattr(s, base, ("--xattr-max-bytes", str(matched_limit(n))),
                                 f"{s}, limit holding {n}")
                r["vs gocryptfs"] = r["bogo ops/s"] / goc[0]["bogo ops/s"]
                srows.append(r)
        for r in srows:
            r.setdefault("vs gocryptfs", "")
        text += ("\n\nstress-ng --xattr 1, 10 s\n\n"
                 + table(srows, ["system", "attrs per op", "bogo ops/s", "attrs/s",
                                 "vs gocryptfs"]))
    print(text.strip())
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
