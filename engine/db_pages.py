"""Rows read straight off a SQLite file's table leaf pages, for the salvage when the b-tree above them is
damaged (an overwritten root or interior page, or page 1 with the schema).

A table's rows live on its leaf pages; the pages above only point at them. So when a lookup through the
tree fails, each page of the file is read on its own: a table leaf page (type 0x0D) gives its cells (rowid
and record, overflow chain followed). Pages on the free list are skipped, so rows deleted long ago do not
come back. The caller decides which table a record belongs to by its shape. Nothing here trusts the file:
every offset is bounds-checked and a page that does not parse is skipped.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path

HEADER = b"SQLite format 3\x00"
TABLE_LEAF = 0x0D
MAX_OVERFLOW_PAGES = 1 << 16  # a loop in a damaged chain must end


class _Bad(Exception):
    """This page (or this cell) does not parse: skip it."""


def leaf_rows(path: Path) -> Iterator[tuple[int, int, list]]:
    """(page number, rowid, record values) for every cell of every table leaf page not on the free list."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size < 512:
            return
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:  # not read whole: it may be large
            yield from _rows(data)


def _rows(data) -> Iterator[tuple[int, int, list]]:
    page_size, reserved = _geometry(data)
    usable = page_size - reserved
    pages = len(data) // page_size
    free = _free_pages(data, page_size, pages)
    for number in range(1, pages + 1):
        if number in free:
            continue
        base = (number - 1) * page_size
        start = base + (100 if number == 1 else 0)  # page 1 begins with the file header
        if data[start] != TABLE_LEAF:
            continue
        try:
            cells = _cell_offsets(data, base, start, usable)
        except _Bad:
            continue
        for offset in cells:
            try:
                rowid, values = _cell(data, base + offset, base + usable, page_size, usable, pages)
            except (_Bad, IndexError, UnicodeDecodeError, struct.error):
                continue
            yield number, rowid, values


def _geometry(data: bytes) -> tuple[int, int]:
    """(page size, reserved bytes per page) from the header; SQLite's defaults when it is unreadable."""
    if data[:16] == HEADER and len(data) >= 100:
        size = int.from_bytes(data[16:18], "big")
        size = 65536 if size == 1 else size
        if size >= 512 and size & (size - 1) == 0:
            return size, data[20]
    return 4096, 0


def _free_pages(data: bytes, page_size: int, pages: int) -> set[int]:
    """The free list's pages (trunks and leaves), when page 1 says where it is."""
    free: set[int] = set()
    if data[:16] != HEADER:
        return free
    trunk = int.from_bytes(data[32:36], "big")
    while 0 < trunk <= pages and trunk not in free:
        free.add(trunk)
        base = (trunk - 1) * page_size
        count = int.from_bytes(data[base + 4:base + 8], "big")
        if count > (page_size - 8) // 4:
            break
        for i in range(count):
            free.add(int.from_bytes(data[base + 8 + 4 * i:base + 12 + 4 * i], "big"))
        trunk = int.from_bytes(data[base:base + 4], "big")
    return free


def _cell_offsets(data: bytes, base: int, start: int, usable: int, header: int = 8) -> list[int]:
    """Where a page's cells begin (``header``: 8 bytes for a leaf page, 12 for an interior one)."""
    count = int.from_bytes(data[start + 3:start + 5], "big")
    if count > usable // 4:
        raise _Bad
    offsets = [int.from_bytes(data[start + header + 2 * i:start + header + 2 + 2 * i], "big") for i in range(count)]
    if any(not 8 <= o < usable for o in offsets):
        raise _Bad
    return offsets


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[pos + i]
        if i == 8:
            return (value << 8) | byte, pos + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos + i + 1
    raise _Bad  # not reached


def _cell(data: bytes, at: int, page_end: int, page_size: int, usable: int, pages: int) -> tuple[int, list]:
    size, pos = _varint(data, at)
    rowid, pos = _varint(data, pos)
    if rowid >= 1 << 63:
        rowid -= 1 << 64
    payload = _payload(data, pos, page_end, size, page_size, usable, pages)
    return rowid, _record(payload)


def _payload(data: bytes, pos: int, page_end: int, size: int, page_size: int, usable: int, pages: int) -> bytes:
    """A cell's payload: its local part, then its overflow pages (SQLite's split for table leaves)."""
    local = _local_size(size, usable, usable - 35)
    if size > (pages + 1) * page_size or pos + local + (4 if local < size else 0) > page_end:
        raise _Bad  # the cell runs past its page: not a cell SQLite wrote
    parts = [data[pos:pos + local]]
    if local < size:
        first = int.from_bytes(data[pos + local:pos + local + 4], "big")
        for page in _chain(data, first, size - local, page_size, usable, pages):
            base = (page - 1) * page_size
            parts.append(data[base + 4:base + 4 + min(usable - 4, size - sum(map(len, parts)))])
    payload = b"".join(parts)
    if len(payload) != size:
        raise _Bad
    return payload


def _local_size(size: int, usable: int, most: int) -> int:
    """How much of a payload of ``size`` bytes stays on its page (``most``: the cell kind's largest)."""
    if size <= most:
        return size
    least = (usable - 12) * 32 // 255 - 23
    local = least + (size - least) % (usable - 4)
    return least if local > most else local


def _chain(data: bytes, page: int, needed: int, page_size: int, usable: int, pages: int) -> list[int]:
    """The overflow pages holding the ``needed`` bytes of a payload that do not fit on its page."""
    chain: list[int] = []
    while needed > 0:
        if not 1 < page <= pages or len(chain) > MAX_OVERFLOW_PAGES:
            raise _Bad
        chain.append(page)
        needed -= usable - 4
        base = (page - 1) * page_size
        page = int.from_bytes(data[base:base + 4], "big")
    return chain


def unreadable_pages(path: Path) -> set[int] | None:
    """The pages of the file that are neither a b-tree page whose cells parse, nor on the free list, nor an
    overflow page a parsed cell leads to: what they held is lost. None when that cannot be told (a file
    with pointer-map pages, which look like neither)."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size < 512:
            return set()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if data[:16] == HEADER and int.from_bytes(data[52:56], "big"):  # auto-vacuum: pointer maps
                return None
            page_size, reserved = _geometry(data)
            usable = page_size - reserved
            pages = len(data) // page_size
            seen = _free_pages(data, page_size, pages)
            if len(data) > 1 << 30:  # the lock-byte page holds nothing
                seen.add((1 << 30) // page_size + 1)
            for number in range(1, pages + 1):
                if number in seen:
                    continue
                try:
                    overflow = _overflow_of(data, number, page_size, usable, pages)
                except (_Bad, IndexError):
                    continue
                seen.add(number)
                seen.update(overflow)
            return set(range(1, pages + 1)) - seen


INDEX_INTERIOR, TABLE_INTERIOR, INDEX_LEAF = 0x02, 0x05, 0x0A


def _overflow_of(data: bytes, number: int, page_size: int, usable: int, pages: int) -> list[int]:
    """The overflow pages the cells of b-tree page ``number`` lead to; _Bad when it is no b-tree page."""
    base = (number - 1) * page_size
    start = base + (100 if number == 1 else 0)
    kind = data[start]
    if kind not in (INDEX_INTERIOR, TABLE_INTERIOR, INDEX_LEAF, TABLE_LEAF):
        raise _Bad
    header = 12 if kind in (INDEX_INTERIOR, TABLE_INTERIOR) else 8
    overflow: list[int] = []
    for offset in _cell_offsets(data, base, start, usable, header):
        pos = base + offset
        if kind == TABLE_INTERIOR:
            continue  # a child pointer and a rowid: no payload
        if kind == INDEX_INTERIOR:
            pos += 4
        size, pos = _varint(data, pos)
        if kind == TABLE_LEAF:
            _rowid, pos = _varint(data, pos)
        most = usable - 35 if kind == TABLE_LEAF else (usable - 12) * 64 // 255 - 23
        local = _local_size(size, usable, most)
        if local < size:
            if pos + local + 4 > base + usable:
                raise _Bad
            first = int.from_bytes(data[pos + local:pos + local + 4], "big")
            overflow += _chain(data, first, size - local, page_size, usable, pages)
    return overflow


def _record(payload: bytes) -> list:
    """The values of a record: header of serial types, then the values in order."""
    header_size, pos = _varint(payload, 0)
    if not 0 < header_size <= len(payload):
        raise _Bad
    types = []
    while pos < header_size:
        kind, pos = _varint(payload, pos)
        types.append(kind)
    values: list = []
    pos = header_size
    for kind in types:
        if kind == 0:
            values.append(None)
        elif 1 <= kind <= 6:
            width = (1, 2, 3, 4, 6, 8)[kind - 1]
            if pos + width > len(payload):
                raise _Bad
            values.append(int.from_bytes(payload[pos:pos + width], "big", signed=True))
            pos += width
        elif kind == 7:
            values.append(struct.unpack(">d", payload[pos:pos + 8])[0])
            pos += 8
        elif kind in (8, 9):
            values.append(kind - 8)
        elif kind >= 12:
            width = (kind - 12) // 2
            if pos + width > len(payload):
                raise _Bad
            raw = payload[pos:pos + width]
            values.append(raw.decode("utf-8") if kind % 2 else raw)  # the databases Hearth writes are UTF-8
            pos += width
        else:
            raise _Bad  # 10 and 11 are reserved
    return values
