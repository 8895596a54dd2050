"""A parent passes chosen descriptors to a child with subprocess (close_fds,
pass_fds, stdio redirected onto them); the child, itself under the engine
once it allocates, lists every descriptor it has open below its limit. A
plain child sees exactly 0, 1, 2 and the passed ones: so must one under the
engine. Also closes everything above 2 with os.closerange and keeps working."""
import os
import subprocess
import sys
import time

if len(sys.argv) > 1 and sys.argv[1] == "child":
    ballast = [bytearray(1 << 20) for _ in range(8)]  # the engine starts
    ballast[3][4096] = 1
    copies = [bytes(b) for b in ballast]
    found = set()
    # Every number below the limit once, then the low ones for a while: a
    # descriptor the engine's background scans held even for a moment shows.
    for fd in range(os.sysconf("SC_OPEN_MAX")):
        try:
            os.fstat(fd)
        except OSError:
            continue
        found.add(fd)
    end = time.monotonic() + float(os.environ.get("PASS_FDS_WATCH_S", "1"))
    while time.monotonic() < end:
        copies[0] = bytes(ballast[0])  # work for the scanner
        for fd in range(64):
            try:
                os.fstat(fd)
            except OSError:
                continue
            found.add(fd)
    print(",".join(map(str, sorted(found))), sum(c[4096] for c in copies))
    sys.exit(0)

big = [bytearray(1 << 20) for _ in range(4)]  # the engine starts here too
passed = [os.open(os.devnull, os.O_RDWR) for _ in range(2)]
r, w = os.pipe()
passed.insert(1, w)
with subprocess.Popen([sys.executable, __file__, "child"], stdin=passed[0],
                      stdout=passed[1], stderr=passed[2], close_fds=True,
                      pass_fds=passed) as p:
    p.wait()
    os.close(w)
    out = os.read(r, 4096).decode().split()
fds = {int(x) for x in out[0].split(",")}
want = {0, 1, 2} | set(passed)
print("child sees exactly its own:", fds == want, "extra:", sorted(fds - want), out[1])

os.closerange(3, 1 << 16)
more = [bytes(b) for b in big] + [bytearray(1 << 20) for _ in range(4)]
print("after closerange:", sum(len(m) for m in more))
