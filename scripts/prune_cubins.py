"""Zero the CUDA machine code a GPU of another architecture would load, in a shared library's fat binaries.

``python scripts/prune_cubins.py LIBRARY SM`` rewrites LIBRARY in place: every cubin (an ELF entry of a fat binary)
whose SM version is not SM (90: the H100 and H200) is overwritten with zeros, its size and every offset kept, so
the library loads as before and a GPU of that SM finds its own code; PTX entries are kept (a driver compiles them
for an SM it has no cubin for). ONNX Runtime's CUDA provider carries cubins for seven architectures: zeroed, they
compress to nothing, which makes the library fit the few calls a lent GPU machine allows (``gpu_session.sh``).

A fat binary: a 16-byte header (magic 0xBA55ED50, version 1, header size, size of its entries), then entries,
each a header (kind: 1 PTX, 2 ELF; its own size; the payload's padded size; the SM version at byte 28) and the
payload.
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
ELF = 2


def prune(data: bytearray, keep_sm: int) -> int:
    """Zero every cubin not for ``keep_sm`` in ``data``; the bytes zeroed."""
    zeroed, position = 0, 0
    while (start := data.find(MAGIC, position)) >= 0:
        version, header_size, entries_size = struct.unpack_from("<HHQ", data, start + 4)
        if version != 1 or header_size != 16:
            position = start + 4
            continue
        entry, end = start + header_size, start + header_size + entries_size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            sm = struct.unpack_from("<I", data, entry + 28)[0]
            if kind == ELF and sm != keep_sm:
                data[entry + entry_header : entry + entry_header + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        position = end
    return zeroed


def main() -> None:
    path, keep_sm = Path(sys.argv[1]), int(sys.argv[2])
    data = bytearray(path.read_bytes())
    zeroed = prune(data, keep_sm)
    path.write_bytes(data)
    print(f"{path.name}: {zeroed / 1e6:.1f} MB of cubins for other GPUs than sm_{keep_sm} zeroed")


if __name__ == "__main__":
    main()
