"""A profiled run's trace (`*.xplane.pb`) as the profile plugin's tool tables: the one
place mpt calls xprof's converter.

xprof (the package of TensorBoard's profile plugin) offers no public API for it:
`xprof.convert.raw_to_tool_data.xspace_to_tool_data([paths], tool, params)` is the
function the plugin's own server calls, used here as xprof 2.24 (with TensorBoard
2.21) has it (XPROF_VERSION). It returns (data, content type); `data` is the tool's
JSON DataTable, empty when xprof cannot convert the trace. The tools read:
`framework_op_stats` (the "TensorFlow stats" page, mpt/diagnose/opstats.py),
`kernel_stats` (mpt/machine/gpu_kernels.py, gpu_profile.py), `overview_page` and
`input_pipeline_analyzer` (gpu_profile.py). tests/test_architecture.py keeps every
other module off xprof's internals and checks that the function still exists.

The converter is C++: a failed check in it aborts the process (SIGABRT), and it writes
a cache (`ALL_HOSTS.op_stats_v2.pb`) next to its input. So it runs in a child Python
(`python -m mpt.machine.traces`, which imports neither TensorFlow nor mpt's wings: a
start costs ~0.15 s), on a copy of the trace in a temporary `plugins/profile/<run>/`
folder (xprof wants that layout and an absolute path), converting every tool asked
for in one start. A child that dies gives `ConverterError` naming the signal, never a
dead caller nor an "out of memory".
"""

import base64
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Sequence

XPROF_VERSION = "2.24"
TIMEOUT_S = 300  # A 3 MB eight-GPU trace converts in well under a second.
_FATAL = re.compile(r"^F\d{4} ")  # How absl's C++ logging starts a fatal line.


class ConverterError(RuntimeError):
  """xprof's converter failed: it raised, died on a signal or ran out of time."""


def child_command() -> list[str]:
  """The child's command line, before its arguments (tests put an aborting one here)."""
  return [sys.executable, "-m", "mpt.machine.traces"]


def convert(trace: pathlib.Path | str, tools: Sequence[str], quiet: bool = True,
            timeout_s: float = TIMEOUT_S) -> dict[str, tuple[Any, Any, str | None]]:
  """xprof's tables of one trace, {tool: (data, content type, error)}: `error` is what
  xprof raised on that tool (data None), else None. ImportError without xprof;
  ConverterError when the child dies or times out; OSError when the trace cannot be
  copied. `quiet`: xprof's C++ log lines (one per stage, on fd 2) are dropped, else
  passed on to this process's stderr."""
  trace = pathlib.Path(trace)
  with tempfile.TemporaryDirectory(prefix="mpt-xprof-") as scratch:
    run = pathlib.Path(scratch, "plugins", "profile", "run")
    run.mkdir(parents=True)
    copy = run / trace.name
    shutil.copyfile(trace, copy)  # OSError for a missing trace: the caller's to tell.
    out = pathlib.Path(scratch, "out.json")
    try:
      done = subprocess.run(child_command() + [str(out), str(copy.resolve()), *tools],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=timeout_s, env=_env())
    except subprocess.TimeoutExpired as e:
      raise ConverterError(f"xprof's converter ran past {timeout_s:g} s on {trace}") from e
    log = done.stderr.decode("utf-8", errors="replace")
    if not quiet and log:
      sys.stderr.write(log)
    if done.returncode != 0 or not out.exists():
      raise ConverterError(_death(done.returncode, log, trace))
    result = json.loads(out.read_text())
  if result.get("import_error"):
    raise ImportError(result["import_error"])
  return {tool: (_decoded(r), r.get("type"), r.get("error"))
          for tool, r in result["tools"].items()}


def tool_data(trace: pathlib.Path | str, tool: str,
              quiet: bool = False) -> tuple[Any, Any]:
  """xprof's `tool` table of one trace, as (data, content type); ImportError without
  xprof, ConverterError when xprof raises on the trace or its child dies, OSError
  when there is no trace to copy."""
  data, kind, error = convert(trace, [tool], quiet=quiet)[tool]
  if error:
    raise ConverterError(f"xprof could not convert {trace} to {tool}: {error}")
  return data, kind


def _env() -> dict[str, str]:
  """This process's environment, with mpt's source tree first on the child's path
  (mpt may run from a checkout, not installed)."""
  root = str(pathlib.Path(__file__).resolve().parents[2])
  path = os.environ.get("PYTHONPATH")
  return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


def _death(code: int, log: str, trace: pathlib.Path) -> str:
  """One line on how the child ended: the signal, and xprof's last words (a C++
  `Check failed` line) where it left any."""
  if code < 0:
    try:
      how = f"signal {signal.Signals(-code).name}"
    except ValueError:
      how = f"signal {-code}"
  else:
    how = f"exit status {code}"
  last = [l.strip() for l in log.splitlines() if l.strip()]
  said = next((l for l in reversed(last) if "Check failed" in l or _FATAL.match(l)),
              last[-1] if last else "")
  return (f"xprof's converter died on {trace}: {how}"
          + (f" ({said[:300]})" if said else ""))


def _decoded(record: dict[str, Any]) -> Any:
  if record.get("base64") is not None:
    return base64.b64decode(record["base64"])
  return record.get("data")


def _encoded(data: Any) -> dict[str, Any]:
  """A tool's data for JSON: text stays text, other bytes travel as base64."""
  if isinstance(data, (bytes, bytearray)):
    try:
      return {"data": bytes(data).decode("utf-8")}
    except UnicodeDecodeError:
      return {"base64": base64.b64encode(bytes(data)).decode("ascii")}
  return {"data": data}


def _child(argv: list[str]) -> None:
  """The child's work: OUT TRACE TOOL...; writes {"tools": {tool: {data, type,
  error}}} (or {"import_error"}) to OUT."""
  out, trace, tools = argv[0], argv[1], argv[2:]
  try:
    from xprof.convert import raw_to_tool_data  # The profile plugin's converter.
  except ImportError as e:
    pathlib.Path(out).write_text(json.dumps({"import_error": str(e)}))
    return
  found = {}
  for tool in tools:
    try:
      data, kind = raw_to_tool_data.xspace_to_tool_data(
          [trace], tool, {"use_saved_result": False})
      found[tool] = {**_encoded(data), "type": kind, "error": None}
    except Exception as e:  # One tool's failure is that tool's answer, not the run's.
      found[tool] = {"data": None, "type": None, "error": f"{type(e).__name__}: {e}"}
  pathlib.Path(out).write_text(json.dumps({"tools": found}))


if __name__ == "__main__":
  _child(sys.argv[1:])
