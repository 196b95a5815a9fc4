#!/usr/bin/env python3
"""Small-file workload for bench/fs.sh, in one process so that process start-up does not
dominate (2,000 `dd`s would cost more than the file system under test).

  smallfiles.py create DIR N SIZE SRC [SYNCDIR...]
                                        create N files of SIZE bytes (contents: consecutive
                                        slices of SRC), then syncfs(DIR), fsync(DIR) and
                                        syncfs of each SYNCDIR (the backing file system);
                                        prints seconds
  smallfiles.py read DIR N SIZE SRC     list DIR, read every file back and check its
                                        contents against SRC; prints seconds

The timed region is the file-system work only (the comparison with SRC is a memcmp of data
already in memory and is included; it is negligible next to a FUSE round trip).
"""
import ctypes
import os
import sys
import time


def name(i):
    return "f%05d" % i


def main():
    op, d, n, size, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    with open(src, "rb") as f:
        data = f.read(n * size)
    if len(data) < n * size:
        sys.exit("smallfiles: %s is shorter than %d bytes" % (src, n * size))
    if op == "create":
        libc = ctypes.CDLL(None, use_errno=True)
        t0 = time.monotonic()
        for i in range(n):
            fd = os.open(os.path.join(d, name(i)), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)[i * size:(i + 1) * size]
                while view:
                    w = os.write(fd, view)
                    view = view[w:]
            finally:
                os.close(fd)
        for sd in [d] + sys.argv[6:]:
            dfd = os.open(sd, os.O_RDONLY | os.O_DIRECTORY)
            try:
                if libc.syncfs(dfd) != 0:
                    e = ctypes.get_errno()
                    sys.exit("smallfiles: syncfs(%s): %s" % (sd, os.strerror(e)))
                if sd == d:
                    os.fsync(dfd)  # FUSE: FSYNCDIR (syncfs sends no fsync to the daemon)
            finally:
                os.close(dfd)
        print("%.6f" % (time.monotonic() - t0))
    elif op == "read":
        t0 = time.monotonic()
        names = sorted(os.listdir(d))
        if len(names) != n:
            sys.exit("smallfiles: %s holds %d entries, expected %d" % (d, len(names), n))
        bad = 0
        for i, nm in enumerate(names):
            if nm != name(i):
                sys.exit("smallfiles: unexpected entry %r in %s" % (nm, d))
            with open(os.path.join(d, nm), "rb", buffering=0) as f:
                got = f.read(size + 1)
                while len(got) < size + 1:
                    more = f.read(size + 1 - len(got))
                    if not more:
                        break
                    got += more
            if got != data[i * size:(i + 1) * size]:
                bad += 1
                if bad <= 5:
                    print("smallfiles: %s/%s: wrong contents (%d bytes read)" % (d, nm, len(got)),
                          file=sys.stderr)
        dt = time.monotonic() - t0
        if bad:
            sys.exit("smallfiles: %d of %d files read back wrong" % (bad, n))
        print("%.6f" % dt)
    else:
        sys.exit("usage: smallfiles.py create|read DIR N SIZE SRC")


if __name__ == "__main__":
    main()
