"""Copies between objects whose data sits at different offsets in their
allocations: bytes(a_bytearray) (a bytes object's data follows its 32-byte
header; a bytearray's buffer is an allocation of its own) and back. After two
such copies the engine places later bytes objects so that their data lines up
and their copies are mapped. Every byte is checked, and the placed objects are
grown, shrunk and freed as Python does (realloc, free)."""
import hashlib
import random

src = bytearray(random.Random(1).randbytes(1 << 20)) * 16  # 16 MiB
want = hashlib.sha256(src).hexdigest()
copies = [bytes(src) for _ in range(6)]
assert all(hashlib.sha256(c).hexdigest() == want for c in copies)
src[100] ^= 0xFF                                    # the copies keep their bytes
assert all(c[100] == copies[0][100] for c in copies) and src[100] != copies[0][100]
back = [bytearray(c) for c in copies[:3]]
back[0][5000] ^= 1
assert copies[0][5000] != back[0][5000] and back[1] == copies[1]
grown = bytearray(copies[2])
grown.extend(b"tail" * 1000)                        # realloc to a larger size
del grown[-(8 << 20):]                              # realloc to a smaller size
assert grown == copies[2][: len(grown)]
print("ok", want[:16], len(grown))
