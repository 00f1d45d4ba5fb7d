"""A profiled run's trace (`*.xplane.pb`) as one of the profile plugin's tool tables:
the one place mpt calls xprof's converter.

xprof (the package of TensorBoard's profile plugin) offers no public API for it:
`xprof.convert.raw_to_tool_data.xspace_to_tool_data([paths], tool, params)` is the
function the plugin's own server calls, used here as xprof 2.24 (with TensorBoard
2.21) has it (XPROF_VERSION). It returns (data, content type); `data` is the tool's
JSON DataTable, empty when xprof cannot convert the trace. The tools read:
`framework_op_stats` (the "TensorFlow stats" page, mpt/diagnose/opstats.py) and
`kernel_stats` (mpt/machine/gpu_kernels.py). tests/test_architecture.py keeps every
other module off xprof's internals and checks that the function still exists.
xprof is imported only when a trace is converted.
"""

import contextlib
import pathlib
from typing import Any

from mpt import console

XPROF_VERSION = "2.24"
# The internal used, for the guard test: (module, attribute).
CONVERTER = ("xprof.convert.raw_to_tool_data", "xspace_to_tool_data")


def tool_data(trace: pathlib.Path | str, tool: str,
              quiet: bool = False) -> tuple[Any, Any]:
  """xprof's `tool` table of one trace, as (data, content type); ImportError without
  xprof, and whatever xprof raises on a trace it cannot read. `quiet`: the line per
  stage xprof's C++ logging writes to fd 2 meanwhile is dropped."""
  from xprof.convert import raw_to_tool_data  # The profile plugin's converter.
  with console.quiet_fd2() if quiet else contextlib.nullcontext():
    return raw_to_tool_data.xspace_to_tool_data([str(trace)], tool, {})
