"""Reads a few integer variables (the training step) out of a TensorFlow checkpoint without TensorFlow.

The agent must stay small and never imports TensorFlow, yet it must know at which training step a
checkpoint was saved to tell which checkpoint an evaluator's TensorBoard summaries are about. A checkpoint
`<prefix>` is a tensor bundle: `<prefix>.index`, a table in LevelDB's format (blocks of prefix-compressed
sorted keys, an index block, a 48-byte footer) that maps each variable's name to a BundleEntryProto (dtype,
shard, offset, size), and `<prefix>.data-NNNNN-of-MMMMM`, the raw values. TensorFlow writes the index
uncompressed. Only what is needed to read a scalar int32/int64 is decoded here.
"""

from __future__ import annotations

import os
import struct

from tfcluster.daemon.agent.tasks import handback

FOOTER_BYTES = 48
TABLE_MAGIC = 0xdb4775248b80fb57
BLOCK_TRAILER_BYTES = 5  # compression type, then a CRC
NO_COMPRESSION = 0
HEADER_KEY = b""  # the bundle's header entry (its number of shards)
INTEGER_FORMATS = {3: "<i", 9: "<q"}  # DataType DT_INT32, DT_INT64 -> struct format
MAX_INDEX_BYTES = 64 << 20


def read_steps(prefix: str, names: tuple[str, ...], owner: int | None = None) -> dict[str, int]:
    """The values of the scalar integer variables among `names` that the checkpoint at prefix holds, read from
    files of owner's alone (the task's user: handback.py).

    Raises OSError when a file cannot be read and ValueError when it is not a checkpoint this reads."""
    index = handback.read_bytes(prefix + ".index", owner, MAX_INDEX_BYTES + 1)
    if len(index) > MAX_INDEX_BYTES or len(index) < FOOTER_BYTES:
        raise ValueError(f"{prefix}.index: not a checkpoint index ({len(index)} bytes)")
    blocks = _index_entries(index)
    header = _fields(_lookup(index, blocks, HEADER_KEY) or b"")
    shards = header.get(1, 1)
    found = {}
    for name in names:
        entry = _lookup(index, blocks, name.encode())
        if entry is None:
            continue
        fields = _fields(entry)
        layout = INTEGER_FORMATS.get(fields.get(1, 0))
        if layout is None or fields.get(5, 0) != struct.calcsize(layout):
            continue  # not a scalar integer
        data_path = f"{prefix}.data-{fields.get(3, 0):05d}-of-{shards:05d}"
        with os.fdopen(handback.open_file(data_path, owner), "rb") as f:
            f.seek(fields.get(4, 0))
            raw = f.read(struct.calcsize(layout))
        if len(raw) == struct.calcsize(layout):
            found[name] = struct.unpack(layout, raw)[0]
    return found


def _index_entries(index: bytes) -> list[tuple[bytes, tuple[int, int]]]:
    """The table's index block: (the last key of a data block or more, that block's (offset, size)), sorted."""
    footer = index[-FOOTER_BYTES:]
    if struct.unpack("<Q", footer[-8:])[0] != TABLE_MAGIC:
        raise ValueError("not a checkpoint index (bad magic number)")
    _, pos = _varint(footer, _varint(footer, 0)[1])  # skip the metaindex handle
    offset, pos = _varint(footer, pos)
    size, _ = _varint(footer, pos)
    entries = []
    for key, value in _block(index, offset, size):
        block_offset, pos = _varint(value, 0)
        block_size, _ = _varint(value, pos)
        entries.append((key, (block_offset, block_size)))
    return entries


def _lookup(index: bytes, blocks: list[tuple[bytes, tuple[int, int]]], key: bytes) -> bytes | None:
    """The value stored under key: in the first data block whose index key is >= key (keys are sorted)."""
    for last_key, (offset, size) in blocks:
        if key <= last_key:
            for entry_key, value in _block(index, offset, size):
                if entry_key == key:
                    return value
            return None
    return None


def _block(index: bytes, offset: int, size: int) -> list[tuple[bytes, bytes]]:
    """A block's (key, value) pairs; each key shares a prefix with the one before it."""
    if offset + size + BLOCK_TRAILER_BYTES > len(index):
        raise ValueError("a block lies outside the index file")
    if index[offset + size] != NO_COMPRESSION:
        raise ValueError("compressed checkpoint index")
    block = index[offset:offset + size]
    restarts = struct.unpack("<I", block[-4:])[0]
    end = len(block) - 4 * (restarts + 1)
    if end < 0:
        raise ValueError("a block's restart array is larger than the block")
    pairs, pos, key = [], 0, b""
    while pos < end:
        shared, pos = _varint(block, pos)
        unshared, pos = _varint(block, pos)
        length, pos = _varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        pairs.append((key, block[pos:pos + length]))
        pos += length
    return pairs


def _fields(message: bytes) -> dict[int, int | bytes]:
    """A protobuf message's fields by number: integers for varints, bytes otherwise (first occurrence)."""
    fields: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(message):
        tag, pos = _varint(message, pos)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, pos = _varint(message, pos)
        elif wire_type == 2:
            length, pos = _varint(message, pos)
            value, pos = message[pos:pos + length], pos + length
        elif wire_type in (1, 5):
            width = 8 if wire_type == 1 else 4
            value, pos = message[pos:pos + width], pos + width
        else:
            raise ValueError(f"unexpected protobuf wire type {wire_type}")
        fields.setdefault(number, value)
    return fields


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
