"""A profiler capture (`*.xplane.pb`, a serialized `XSpace`) read directly: the GPU
device planes' stats (compute capability, SMs, clock, memory) and the kernels each GPU
ran, with the TensorFlow op each ran for. xprof's converter does not give these:
kernel_stats has no device column and, for TF <= 2.4 captures, no op names.

The schema is openxla/xprof's (tsl) `tsl/profiler/protobuf/xplane.proto`, declared here
with only the fields read (their numbers never change: the file is a wire format), in a
pool of its own: no TensorFlow import, no clash with TF's own copy when both load.
Names and stats as TensorFlow's (tsl) `xplane_schema` writes them: planes
"/device:GPU:N"; per GPU the stats clock_rate (kHz), core_count (SMs),
memory_bandwidth (bytes/s), memory_size (bytes), compute_cap_major/minor and, in
newer captures, device_type_string/device_vendor; stream lines "Stream #N(...)" hold
kernel and memcpy events; the op a kernel ran for is its `tf_op` stat (newer) or its
`level 0`/`annotation` stat ("scope/name:Type", TF 2.3/2.4); a "Steps" line spans the
steps profiled.
"""

import dataclasses
import functools
import re

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
# (message, [(field, number, type)]): xplane.proto, trimmed. A type is a scalar's or a
# message's name; "[]" after it: a repeated field.
_SCHEMA = (
    ("XSpace", [("planes", 1, "XPlane[]"), ("errors", 2, "string[]"),
                ("hostnames", 4, "string[]")]),
    ("XPlane", [("id", 1, "int64"), ("name", 2, "string"), ("lines", 3, "XLine[]"),
                ("event_metadata", 4, "EventMetadataEntry[]"),
                ("stat_metadata", 5, "StatMetadataEntry[]"), ("stats", 6, "XStat[]")]),
    # A proto map is a repeated message {key = 1, value = 2} on the wire.
    ("EventMetadataEntry", [("key", 1, "int64"), ("value", 2, "XEventMetadata")]),
    ("StatMetadataEntry", [("key", 1, "int64"), ("value", 2, "XStatMetadata")]),
    ("XLine", [("id", 1, "int64"), ("name", 2, "string"), ("events", 4, "XEvent[]")]),
    ("XEvent", [("metadata_id", 1, "int64"), ("duration_ps", 3, "int64"),
                ("stats", 4, "XStat[]"), ("num_occurrences", 5, "int64")]),
    ("XStat", [("metadata_id", 1, "int64"), ("double_value", 2, "double"),
               ("uint64_value", 3, "uint64"), ("int64_value", 4, "int64"),
               ("str_value", 5, "string"), ("ref_value", 7, "uint64")]),
    ("XEventMetadata", [("id", 1, "int64"), ("name", 2, "string"),
                        ("display_name", 4, "string")]),
    ("XStatMetadata", [("id", 1, "int64"), ("name", 2, "string")]),
)
_SCALARS = {"int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64, "double": _F.TYPE_DOUBLE,
            "string": _F.TYPE_STRING}
_VALUES = ("int64_value", "uint64_value", "double_value", "str_value", "ref_value")
_GPU_PLANE = re.compile(r"^/device:GPU:(\d+)$")
# Stats naming a device's model, newest first.
_MODEL_STATS = ("device_type_string", "device_description", "device_name")


@functools.lru_cache(maxsize=1)
def _space_class():
  """The XSpace message class, built once from _SCHEMA (proto2: fields have
  presence, strings are not checked for UTF-8)."""
  file = descriptor_pb2.FileDescriptorProto(name="mpt_xplane.proto",
                                            package="mpt_xplane", syntax="proto2")
  for name, fields in _SCHEMA:
    message = file.message_type.add(name=name)
    for field, number, kind in fields:
      of, repeated = kind.removesuffix("[]"), kind.endswith("[]")
      message.field.add(name=field, number=number, type=_SCALARS.get(of, _F.TYPE_MESSAGE),
                        label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL,
                        type_name=None if of in _SCALARS else f".mpt_xplane.{of}")
  pool = descriptor_pool.DescriptorPool()
  pool.Add(file)
  return message_factory.GetMessageClass(pool.FindMessageTypeByName("mpt_xplane.XSpace"))


def parse(data: bytes):
  """The XSpace in `data`; google.protobuf's DecodeError when it is not one."""
  space = _space_class()()
  space.ParseFromString(data)
  return space


@dataclasses.dataclass
class KernelEvent:
  """One kernel launch on a GPU stream."""
  kernel: str
  op: str  # The TF op's name, "scope/name" ("" when the trace does not say).
  op_type: str  # "Conv2D" where the trace spells it ("name:Type"), else "".
  ps: int  # Duration, picoseconds.


@dataclasses.dataclass
class Gpu:
  """A GPU plane: its stats, kernels, memcpy time and the profiled steps' span."""
  name: str
  stats: dict = dataclasses.field(default_factory=dict)
  kernels: list[KernelEvent] = dataclasses.field(default_factory=list)
  memcpy_ps: int = 0
  steps: int = 0
  steps_ps: int = 0  # The "Steps" line's total: the profiled steps' wall time.

  @property
  def kernel_ms(self) -> float:
    return sum(k.ps for k in self.kernels) / 1e9

  @property
  def model(self) -> str | None:
    return next((str(self.stats[s]) for s in _MODEL_STATS if self.stats.get(s)), None)


def _stat_values(stats, names: dict[int, str]) -> dict[str, object]:
  """{stat name: value}; a ref_value is the name of the stat metadata it points at."""
  out = {}
  for stat in stats:
    kind = next((v for v in _VALUES if stat.HasField(v)), None)
    if kind is not None:
      value = getattr(stat, kind)
      out[names.get(stat.metadata_id, "")] = names.get(value) if kind == "ref_value" \
          else value
  return out


def op_of(stats: dict[str, object]) -> tuple[str, str]:
  """(op name, op type) from a kernel event's stats ("scope/name:Type")."""
  for key in ("tf_op", "level 0", "annotation"):
    text = stats.get(key)
    if isinstance(text, str) and text:
      text = text.split("#", 1)[0]  # Annotations append "#from=...,to=...#".
      name, _, kind = text.partition(":")
      return name, kind
  return "", ""


def gpus(space) -> list[Gpu]:
  """The GPU planes of a capture, by device number, each with its kernel events."""
  found = []
  for plane in space.planes:
    if not _GPU_PLANE.match(plane.name):
      continue
    names = {e.key: e.value.name for e in plane.stat_metadata}
    events = {e.key: (e.value.display_name or e.value.name) for e in plane.event_metadata}
    gpu = Gpu(plane.name, _stat_values(plane.stats, names))
    for line in plane.lines:
      if line.name == "Steps":
        gpu.steps = len(line.events)
        gpu.steps_ps = sum(e.duration_ps for e in line.events)
      elif line.name.startswith("Stream"):  # Derived lines (TF ops, scopes) repeat it.
        for event in line.events:
          name = events.get(event.metadata_id, "")
          stats = _stat_values(event.stats, names)
          if "memcpy_details" in stats or name.startswith(("Memcpy", "Memset")):
            gpu.memcpy_ps += event.duration_ps
          else:
            gpu.kernels.append(KernelEvent(name, *op_of(stats), event.duration_ps))
    found.append(gpu)
  return sorted(found, key=lambda g: int(_GPU_PLANE.match(g.name).group(1)))
