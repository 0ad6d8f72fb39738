"""A bundle's model.so checked before it is loaded or uploaded.

A truncated shared library whose checksum was updated to match passes load_bundle, and
dlopen maps its segments past the end of the file: the first touch of such a page kills
the process with SIGBUS, no message. check_shared_library reads the ELF headers only and
refuses a file whose segments or section header table do not lie within it.
"""

from __future__ import annotations

import struct
from pathlib import Path

from .artifact import BundleError

_ET_DYN = 3


def check_shared_library(path: Path) -> None:
    """Refuse `path` unless it is an ELF shared library whose every program header's
    segment (p_offset + p_filesz) and section header table lie within the file."""
    path = Path(path)

    def refuse(why: str):
        raise BundleError(f"{path} is truncated or not a shared library: {why}; recompile or re-copy the bundle")
    try:
        with open(path, "rb") as f:
            header = f.read(64)
            size = f.seek(0, 2)
            if header[:4] != b"\x7fELF":
                refuse(f"no ELF header ({size} bytes)")
            if len(header) < 52 or header[4] not in (1, 2) or header[5] not in (1, 2) or \
                    (header[4] == 2 and len(header) < 64):
                refuse(f"the ELF header is cut short or of no known class and byte order ({size} bytes)")
            wide, order = header[4] == 2, "<" if header[5] == 1 else ">"
            (e_type, _, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = \
                struct.unpack_from(order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH"), header, 16)
            if e_type != _ET_DYN:
                refuse(f"ELF type {e_type}, expected {_ET_DYN} (a shared object)")
            if phnum and phentsize < (56 if wide else 32):
                refuse(f"program header entries of {phentsize} bytes, expected {56 if wide else 32}")
            if phoff + phnum * phentsize > size:
                refuse(f"its program headers end at byte {phoff + phnum * phentsize}, the file has {size}")
            f.seek(phoff)
            table = f.read(phnum * phentsize)
            for i in range(phnum):  # (p_offset, p_filesz) of each segment
                offset, filesz = struct.unpack_from(order + ("Q16xQ" if wide else "I8xI"), table,
                                                    i * phentsize + (8 if wide else 4))
                if offset + filesz > size:
                    refuse(f"segment {i} ends at byte {offset + filesz}, the file has {size}")
            if shoff and shoff + shnum * shentsize > size:
                refuse(f"its section header table ends at byte {shoff + shnum * shentsize}, the file has {size}")
    except OSError as err:
        raise BundleError(f"{path} cannot be read: {err.strerror or err}") from None
