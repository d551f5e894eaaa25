"""A seeded mutational fuzzer for the store protocol and the link opening / wire header.

No atheris or libFuzzer here: inputs are the corpus under tests/data/fuzz
(one file a seed) mutated by a seeded ``random.Random`` (bit flips, byte
sets to edge values, 32-bit fields set to 0/1/2^31/2^32-1, splices of two
seeds, truncation, extension, repeats), and each target checks its own
invariants. test_fuzz.py runs every target for COLLECTIVES_FUZZ_SECONDS
(default 1.5 s each in CI); by hand, e.g.::

    COLLECTIVES_FUZZ_SECONDS=600 COLLECTIVES_FUZZ_SEED=7 python -m pytest tests/test_fuzz.py

A failing input is written under tests/data/fuzz/crashes/ (the seed and the
iteration are in the test's message) so that it can be added to the corpus.
``python tests/_fuzz.py`` rewrites the seed corpus.
"""
from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Callable, Iterator

CORPUS = Path(__file__).resolve().parent / "data" / "fuzz"

_EDGE32 = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 1 << 16, 1 << 24, 0x7FFFFFFF, 0x80000000,
           0xFFFFFFFF]


def seconds() -> float:
    """How long each target runs: COLLECTIVES_FUZZ_SECONDS (default 1.5)."""
    return float(os.environ.get("COLLECTIVES_FUZZ_SECONDS", "1.5"))


def seed() -> int:
    """The run's seed: COLLECTIVES_FUZZ_SEED (default 20)."""
    return int(os.environ.get("COLLECTIVES_FUZZ_SEED", "20"))


def load(kind: str) -> list[bytes]:
    """The seeds of one corpus (tests/data/fuzz/<kind>/*)."""
    return [p.read_bytes() for p in sorted((CORPUS / kind).glob("*")) if p.is_file()]


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    """One to four random mutations of data."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(8)
        if choice == 0 and buf:  # flip a bit
            i = rng.randrange(len(buf))
            buf[i] ^= 1 << rng.randrange(8)
        elif choice == 1 and buf:  # a byte to an edge value
            buf[rng.randrange(len(buf))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF])
        elif choice == 2 and len(buf) >= 4:  # a 32-bit field to an edge value
            i = rng.randrange(len(buf) - 3)
            order = rng.choice(["<I", ">I"])
            struct.pack_into(order, buf, i, rng.choice(_EDGE32))
        elif choice == 3 and buf:  # truncate
            del buf[rng.randrange(len(buf)):]
        elif choice == 4:  # extend with random bytes
            buf += rng.randbytes(rng.randint(1, 64))
        elif choice == 5 and corpus:  # splice with another seed
            other = rng.choice(corpus)
            cut = rng.randint(0, len(buf))
            buf = buf[:cut] + other[rng.randint(0, len(other)):]
        elif choice == 6 and buf:  # repeat a slice
            i = rng.randrange(len(buf))
            j = min(len(buf), i + rng.randint(1, 32))
            buf[i:i] = buf[i:j] * rng.randint(1, 8)
        else:  # replace a slice with random bytes
            if buf:
                i = rng.randrange(len(buf))
                buf[i:i + 4] = rng.randbytes(4)
    return bytes(buf)


def inputs(rng: random.Random, corpus: list[bytes]) -> Iterator[bytes]:
    """Seeds first, then mutations of seeds and, now and then, pure noise."""
    yield from corpus
    while True:
        if rng.random() < 0.05:
            yield rng.randbytes(rng.randint(0, 256))
        else:
            yield mutate(rng, rng.choice(corpus), corpus)


def save_crash(name: str, data: bytes) -> Path:
    """Keep a failing input for the corpus."""
    path = CORPUS / "crashes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run_for(budget: float, step: Callable[[int], None]) -> int:
    """Call step(i) for i = 0, 1, ... until budget seconds have passed; the count."""
    import time
    end = time.monotonic() + budget
    i = 0
    while time.monotonic() < end:
        step(i)
        i += 1
    return i


# ------------------------------------------------------------------ corpus

def _store_frame(op: int, fields: list[bytes]) -> bytes:
    body = b"".join(struct.pack(">I", len(f)) + f for f in fields)
    return struct.pack(">2sBII", b"CS", op, len(fields), len(body)) + body


def _corpus() -> dict:
    hello = struct.pack("<II16sII", 0x49484C43, 3, bytes(16), 0, 1) + bytes(16)
    abort = struct.pack("<II16sII", 0x42414C43, 3, bytes(16), 0, 1) + bytes(16) + \
        b"rank 0: it broke".ljust(96, b"\0") + bytes(32)

    def header(coll, seq, nbytes, aux, count, offset, dtype=2, flags=0):
        return struct.pack("<IBBBBIIIIQQII", 0x4C4C4F43, 2, coll, 0, dtype, seq, nbytes, aux,
                           flags, count, offset, 0, 0)
    return {
        "store": {
            "set": _store_frame(1, [b"addr/0", b"127.0.0.1\n4242\nhost\n0,1"]),
            "get": _store_frame(2, [b"addr/1", struct.pack(">Q", 1000)]),
            "get_long": _store_frame(2, [b"k", struct.pack(">Q", (1 << 64) - 1)]),
            "add": _store_frame(3, [b"barrier/arrived", struct.pack(">q", 1)]),
            "check": _store_frame(4, [b"joined/0", b"joined/1", b"joined/2"]),
            "delete": _store_frame(5, [b"addr/0"]),
            "empty": _store_frame(4, []),
        },
        "link": {
            "hello": hello,
            "abort": abort,
        },
        "wire": {
            "allreduce_ring": header(1, 0, 8, 0, 4, 0),
            "allreduce_tree": header(1, 0, 16, 1, 4, 0),
            "broadcast": header(3, 0, 16, 0, 4, 0),
            "allgatherv": header(2, 0, 16, 0, 8, 16),
            "ipc_desc": header(1, 0, 16, 0, 4, 0, flags=1),
        },
    }


def write_corpus() -> None:
    """(Re)write the seed corpus under tests/data/fuzz."""
    for kind, seeds in _corpus().items():
        d = CORPUS / kind
        d.mkdir(parents=True, exist_ok=True)
        for name, data in seeds.items():
            (d / f"{name}.bin").write_bytes(data)


if __name__ == "__main__":
    write_corpus()
