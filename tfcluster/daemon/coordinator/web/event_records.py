"""Scalars out of TensorBoard event files, without TensorFlow or the `tensorboard` package.

The coordinator does not depend on `tensorboard` (it is in the `tf` extra only: it brings numpy, werkzeug and
a native data server with it), and it needs very little of an event file: an event file is a TFRecord file
(each record: an 8-byte little-endian length, a 4-byte CRC of it, the bytes, a 4-byte CRC of them) whose
records are `tensorflow.Event` messages. protobuf (already a dependency) parses them against the few fields
declared below, with TensorFlow's own field numbers (the Event, Summary and TensorProto messages that
the tensorboard package ships); fields not declared are skipped as unknown.

The CRCs are not checked (CRC-32C is not in Python's standard library): the store already refuses bytes that do
not continue a file where it ends, a record whose length cannot be right stops the file's reading with an error,
and a record that does not parse is counted and skipped.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

HEADER_BYTES, FOOTER_BYTES = 12, 4
MAX_RECORD_BYTES = 64 * 1024 * 1024  # TensorFlow's records are far smaller; a longer one is a damaged length
# TensorFlow's DataType numbers of the scalar types a summary may hold, and how their bytes read.
TENSOR_FORMATS = {1: "<f", 2: "<d", 3: "<i", 9: "<q", 19: "<e"}
DT_BFLOAT16 = 14


class EventFileError(ValueError):
    """An event file that cannot be read on: the message says where and why."""


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    wall_time: float
    value: float


def _declare():
    f = descriptor_pb2.FileDescriptorProto(name="tfcluster_events.proto", package="tfcluster.events",
                                           syntax="proto2")  # proto2: HasField tells a 0.0 from no value
    types = descriptor_pb2.FieldDescriptorProto

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = f.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            m.field.add(name=field_name, number=number, type=kind, label=label, **({"type_name": type_name}
                                                                                    if type_name else {}))

    one, many = types.LABEL_OPTIONAL, types.LABEL_REPEATED
    message("TensorProto", ("dtype", 1, types.TYPE_INT32, one, ""),
            ("tensor_content", 4, types.TYPE_BYTES, one, ""), ("half_val", 13, types.TYPE_INT32, many, ""),
            ("float_val", 5, types.TYPE_FLOAT, many, ""), ("double_val", 6, types.TYPE_DOUBLE, many, ""),
            ("int_val", 7, types.TYPE_INT32, many, ""), ("int64_val", 10, types.TYPE_INT64, many, ""))
    message("Value", ("tag", 1, types.TYPE_STRING, one, ""), ("simple_value", 2, types.TYPE_FLOAT, one, ""),
            ("tensor", 8, types.TYPE_MESSAGE, one, ".tfcluster.events.TensorProto"))
    message("Summary", ("value", 1, types.TYPE_MESSAGE, many, ".tfcluster.events.Value"))
    message("Event", ("wall_time", 1, types.TYPE_DOUBLE, one, ""), ("step", 2, types.TYPE_INT64, one, ""),
            ("summary", 5, types.TYPE_MESSAGE, one, ".tfcluster.events.Summary"))
    # A pool of its own: tensorboard's generated classes, if a process has them, keep the default pool.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tfcluster.events.Event"))


Event = _declare()


def split_records(data: bytes, where: str) -> tuple[list[bytes], int]:
    """The whole records at the start of data, and how many bytes they take (a record still being written is
    left for later). Raises EventFileError for a length no record can have."""
    records, at = [], 0
    while len(data) - at >= HEADER_BYTES:
        (length,) = struct.unpack_from("<Q", data, at)
        if length > MAX_RECORD_BYTES:
            raise EventFileError(f"{where}: a record of {length} bytes at byte {at}: not an event file, or damaged")
        end = at + HEADER_BYTES + length + FOOTER_BYTES
        if end > len(data):
            break
        records.append(data[at + HEADER_BYTES:end - FOOTER_BYTES])
        at = end
    return records, at


def scalars(record: bytes) -> list[Scalar]:
    """The scalar values of one event record (none for other events); ValueError when it is not an Event."""
    event = Event.FromString(record)
    found = []
    for value in event.summary.value:
        number = _scalar(value)
        if number is not None:
            found.append(Scalar(value.tag, event.step, event.wall_time, number))
    return found


def _scalar(value) -> float | None:
    """A Summary.Value's number: simple_value (TF1, tensorboard's writer) or a one-element tensor (tf.summary
    in TF2, Keras's TensorBoard callback); None for images, histograms, text and tensors of several elements."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor"):
        return None
    t = value.tensor
    for numbers in (t.float_val, t.double_val, t.int64_val):
        if len(numbers) == 1:
            return float(numbers[0])
    if len(t.int_val) == 1 and t.dtype in (1, 2, 3, 9):
        return float(t.int_val[0])
    content = t.tensor_content
    if t.dtype == DT_BFLOAT16 and len(content) == 2:
        return struct.unpack("<f", b"\0\0" + content)[0]
    format_ = TENSOR_FORMATS.get(t.dtype)
    if format_ and len(content) == struct.calcsize(format_):
        return float(struct.unpack(format_, content)[0])
    return None
