"""`--mode=sweep --launcher=ray`: a sweep's cells as Ray tasks on a cluster.

Each cell is one Ray task that runs the same child `python -m mpt.main` as a local
sweep (mpt/sweep/cell.py) on a node with the CPUs, GPUs and memory it asks for
(mpt/sweep/requests.py), in a scratch folder there; its run folder comes back to the
driver, under the sweep folder's cells/, so that the report, the diagnosis and
`--mode=compare` read it as any (with --shared_logdir, where every node sees the
logdir at the same path, the cell writes it there itself). How a cell ended is
classified on its node, by the same rules and that node's OOM-kill counters. A task is never retried (a cell is recorded once): a node lost
mid-cell leaves that cell `failed` ("node lost"), and a rerun of the same command
runs only the cells sweep.csv lacks. A stop signal cancels the running tasks, whose
cells stop at a step boundary as a local cell does.

`--machines=all` runs every cell once on each distinct machine: a node's custom
resource `machine:NAME` names it (`ray start --resources='{"machine:v100": 1}'`),
else its CPU model and GPUs do (read on the node). sweep.csv records the machine, and
the report has a block per machine.

Nobody else gets in: the cluster mpt starts itself (no `--ray_address`) runs in Ray's
single-machine mode, every server on the loopback interface, with no dashboard, and
Ray (>= 2.59) authenticates its clients with a token of this user's. Connecting to a
user's cluster says once that it must sit on a trusted network.
"""

import dataclasses
import io
import os
import pathlib
import shutil
import signal
import sys
import tarfile
import tempfile
import threading
import time

from mpt.errors import STOP_SIGNALS, UserError
from mpt.records import cells as cells_lib
from mpt.records.cells import Cell
from mpt.sweep import cell as cell_lib
from mpt.sweep import requests

MACHINE = "machine:"  # A node's custom resource naming its machine.
# What a cell's child must see of the driver's environment, wherever it runs (fault
# injection for tests and demonstrations: mpt/injection.py).
FORWARDED = ("MPT_INJECT_FAULT", "MPT_KILL_AT", "MPT_OOM_KILLS")
WAIT_S = 2.0  # How often a waiting driver checks that every machine still has a node.
# A cancelled cell stops at its next step and writes its checkpoint: seconds.
RECANCEL_S, STOP_GRACE_S = 10.0, 60.0
# Ray's own switch for its single-machine mode (its default on macOS and Windows):
# every server binds the loopback interface. Read when Ray is imported.
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
TRUST = ("mpt: note: Ray runs any code its clients send: the cluster at {} must sit on "
         "a trusted network (Ray >= 2.59 asks clients for its token: RAY_AUTH_MODE=token)")


def connect(address: str):
  """The `ray` module, connected to the cluster at `address`, or to a loopback-only
  cluster of this machine started here; UserError if Ray is not installed."""
  if not address:
    os.environ[LOOPBACK_ENV] = "0"  # Before Ray is imported: its servers read it.
  try:
    import ray
  except ImportError:
    raise UserError("--launcher=ray needs Ray, which is not installed: pip install -e "
                    "'.[cluster]' (or --launcher=local)") from None
  if address:
    print(TRUST.format(address), flush=True)
    ray.init(address=address, log_to_driver=False)
  else:
    # "local": a new cluster, even where RAY_ADDRESS or a running one could be found.
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
  return ray


def _probe() -> str:
  """On a node: its machine, by CPU model and GPUs (without TensorFlow)."""
  import subprocess
  from mpt.machine import isa
  try:
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30).stdout.split("\n")
  except (OSError, subprocess.TimeoutExpired):
    gpus = []
  names = sorted({g.strip() for g in gpus if g.strip()})
  return isa.detect().name + (f" + {', '.join(names)}" if names else "")


def machines(ray, which: str) -> dict[str, requests.Place]:
  """{machine: where its cells go}: one per distinct machine (`which` = "all"), or the
  whole cluster as machine "" ("one")."""
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
  alive = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeID"])
  if which != "all":
    return {"": requests.place(alive, {})}
  nodes, options = {}, {}
  probe = ray.remote(num_cpus=0, max_retries=0)(_probe)
  for node in alive:
    named = sorted(k[len(MACHINE):] for k in node["Resources"] if k.startswith(MACHINE))
    if named:
      name, where = named[0], {"resources": {MACHINE + named[0]: 0.001}}
    else:
      here = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
      name = ray.get(probe.options(scheduling_strategy=here).remote())
      where = {"scheduling_strategy": here}
    nodes.setdefault(name, []).append(node)
    options.setdefault(name, where)
  return {name: requests.place(nodes[name], options[name]) for name in nodes}


def _run_on_node(cfg, cell: Cell, timeout: float | None,
                 shared: pathlib.Path | None) -> tuple[Cell, bytes]:
  """The task: the cell run in a scratch folder of its node, or straight into the
  sweep folder `shared` where every node sees it; (the cell, its run folder as a tar
  archive, or nothing where it was written to `shared`)."""
  from mpt.machine import hardware
  _listen_for_cancel()
  granted = _granted()
  if shared is not None and not shared.is_dir():
    return dataclasses.replace(cell, status="failed", error=(
        f"--shared_logdir: {shared} is not on this node: --logdir must be a path every "
        f"node sees at the same place"), **hardware.environment(), **granted), b""
  # A cell given no GPU sees none (Ray 2.60 hides none from a task that asks for none).
  env = None if granted.get("granted_gpus") else {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
  with tempfile.TemporaryDirectory(prefix="mpt-cell-") as tmp:
    try:
      done = cell_lib.run_cell(cfg, cell, shared or pathlib.Path(tmp), timeout, env)
    except KeyboardInterrupt:  # Cancelled between the child's start and its wait.
      done = dataclasses.replace(cell, status="interrupted", error="SIGINT")
    done = dataclasses.replace(done, **hardware.environment(), **granted)  # This node's.
    archive = io.BytesIO()
    if shared is None and done.run_dir and pathlib.Path(done.run_dir).is_dir():
      with tarfile.open(fileobj=archive, mode="w:gz") as tar:
        tar.add(done.run_dir, arcname=".")
  return done, archive.getvalue()


def _listen_for_cancel() -> None:
  """Lets Ray's cancel reach this task. A non-forced `ray.cancel` interrupts the task
  through `_thread.interrupt_main()`, which does nothing while SIGINT is ignored; and
  a sweep started with `&` from a script (nohup, many CI runners, SLURM batch steps)
  passes SIGINT ignored to Ray's workers. Python's own handler is put back, so the
  cancel raises KeyboardInterrupt here and the cell stops at a step. A task runs on
  its worker's main thread; elsewhere (a test calling this function) nothing
  changes."""
  if threading.current_thread() is threading.main_thread() and (
      signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL)):
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _granted() -> dict:
  """In a task: the GPUs and memory Ray reserved for it, as Cell fields."""
  # Not in a Ray task (a test calls the task's function itself): nothing, and no Ray
  # started here (asked outside a cluster, Ray starts one in this process).
  ray = sys.modules.get("ray")  # A task's worker has imported it.
  if ray is None or not ray.is_initialized():
    return {}
  try:
    got = ray.get_runtime_context().get_assigned_resources()
  except Exception:  # A driver, not a task.
    return {}
  return {"granted_gpus": got.get("GPU"),
          "granted_memory_mb": round(got["memory"] / requests.MB, 1)
          if got.get("memory") else None}


def _landed(done: Cell, archive: bytes, out: pathlib.Path, shared: bool) -> Cell:
  """The cell with its run folder unpacked under the sweep folder's cells/ (or as it
  is, written there from its node: --shared_logdir)."""
  if shared:
    return done
  folder = out / "cells" / done.id
  shutil.rmtree(folder, ignore_errors=True)
  if archive:
    folder.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
      tar.extractall(folder, filter="data")
  return dataclasses.replace(done, run_dir=str(folder) if archive else "")


def run_cells(cfg, opts, todo: list[Cell], done: dict[str, Cell],
              out: pathlib.Path) -> tuple[list[Cell], str | None]:
  """Like the local sweep's `_run_cells`: runs the cells not `done` as Ray tasks,
  appending each to sweep.csv as it ends; (every cell, the stop signal or None)."""
  ray = connect(opts.ray_address)
  previous = {sig: signal.signal(sig, cell_lib.stop) for sig in STOP_SIGNALS}
  try:
    return _submit_and_collect(ray, cfg, opts, todo, done, out)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    ray.shutdown()


def _submit_and_collect(ray, cfg, opts, todo, done, out):
  places = machines(ray, opts.machines)
  planner = requests.Planner(opts.cell_cpus, opts.cell_gpus, cfg.force, places)
  task = ray.remote(max_retries=0)(_run_on_node)
  env = {k: os.environ[k] for k in FORWARDED if k in os.environ}
  out = out.resolve()  # Where a node writes with --shared_logdir: the same path.
  shared = out if opts.shared_logdir else None
  cells = [dataclasses.replace(c, machine=m) for m in places for c in todo]
  finished = {c.id: done[c.id] for c in cells if c.id in done}
  for cell in finished.values():
    planner.ended(cell)  # What they recorded of memory, for the rest.
  pending: dict = {}
  stranded: set = set()  # Tasks whose machine had no node left at the last check.

  def submit(batch: list[Cell]) -> None:
    for cell in batch:  # Smallest batch first: the pilot of each group.
      how = planner.take(cell)
      if isinstance(how, Cell):  # Will not fit any node of its machine.
        _append(how, out, finished)
        submit(planner.ended(how))
      elif how is not None:
        pending[task.options(runtime_env={"env_vars": env}, **how).remote(
            cfg, cell, opts.cell_timeout or None, shared)] = cell

  print(f"mpt: {len(cells) - len(finished)} cells as Ray tasks on {len(ray.nodes())} "
        f"node(s)" + (f", {len(places)} machine(s): {', '.join(places)}"
                      if opts.machines == "all" else ""), flush=True)
  submit(sorted((c for c in cells if c.id not in finished), key=lambda c: c.batch_size))
  stopped = None
  try:
    while pending:
      ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
      for ref in ready:
        submit(planner.ended(_record(ray, ref, pending.pop(ref), out, finished,
                                     shared is not None)))
      if not ready and opts.machines == "all":
        for cell in _fail_stranded(ray, places, pending, out, finished, stranded):
          submit(planner.ended(cell))  # Its group's held cells: failed in turn.
  except KeyboardInterrupt as e:  # A stop signal: the running cells stop at a step.
    stopped = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
    stop_tasks(ray, list(pending))
    for ref, cell in pending.items():
      _record(ray, ref, cell, out, finished, shared is not None, stopping=True)
    print("\nmpt: sweep interrupted; the table holds the cells so far (the same "
          "command resumes)", flush=True)
  return [finished[c.id] for c in cells if c.id in finished], stopped


def stop_tasks(ray, refs: list) -> None:
  """Cancels the tasks and waits until each has ended. A running one gets a
  KeyboardInterrupt, and its cell stops at a step. Once, under load, that interrupt
  never reached a running task (Ray 2.60: the cell trained on to its end), so a task
  still running RECANCEL_S later is cancelled again (its cell's child then exits at
  once), and killed after STOP_GRACE_S or a second stop signal (the child dies with
  it)."""
  deadline, left = time.monotonic() + STOP_GRACE_S, refs
  while left:
    force = time.monotonic() > deadline
    for ref in left:
      ray.cancel(ref, force=force)
    try:
      _, left = ray.wait(left, num_returns=len(left), timeout=RECANCEL_S)
    except KeyboardInterrupt:  # A second stop: no more waiting.
      deadline = 0.0


def _fail_stranded(ray, places: dict, pending: dict, out: pathlib.Path,
                   finished: dict, stranded: set) -> list[Cell]:
  """The cells of a machine none of whose nodes is alive any more (Ray would keep
  them waiting for it forever), found so at two checks in a row (`stranded` keeps
  the first): cancelled, recorded as failed, and returned. One that was running
  there has ended by then with Ray's own error for it ("node lost (...)", _record),
  which the first check, as soon as Ray counts the node dead, could pre-empt."""
  alive, failed, seen = {n["NodeID"] for n in ray.nodes() if n["Alive"]}, [], set()
  for ref, cell in list(pending.items()):
    if alive.intersection(places[cell.machine].nodes):
      continue
    if ref not in stranded:
      seen.add(ref)
      continue
    ray.cancel(ref, force=True)
    del pending[ref]
    failed.append(dataclasses.replace(
        cell, status="failed", error=f"node lost: no node of {cell.machine} is left"))
    _append(failed[-1], out, finished)
  stranded.clear()
  stranded.update(seen)
  return failed


def _record(ray, ref, cell: Cell, out: pathlib.Path, finished: dict, shared: bool,
            stopping: bool = False) -> Cell:
  """The task's cell, its folder landed, appended to sweep.csv; a lost node or a
  cancelled task that never ran is a `failed` or `interrupted` cell, never none."""
  try:
    done, archive = ray.get(ref)
    done = _landed(done, archive, out, shared)
  except ray.exceptions.TaskCancelledError:
    done = dataclasses.replace(cell, status="interrupted", error="cancelled before it ran")
  except ray.exceptions.RayError as e:
    if stopping:  # Killed by stop_tasks, past its grace.
      done = dataclasses.replace(cell, status="interrupted", error=(
          f"killed {STOP_GRACE_S:g} s after the stop ({type(e).__name__})"))
    else:  # The node or its worker died under the cell.
      why = (str(e).strip().splitlines() or [""])[0][:200]
      done = dataclasses.replace(cell, status="failed",
                                 error=f"node lost ({type(e).__name__}): {why}")
  _append(done, out, finished)
  return done


def _append(done: Cell, out: pathlib.Path, finished: dict) -> None:
  cells_lib.append_csv(out / "sweep.csv", done)
  finished[done.id] = done
  print(f"mpt: cell {done.id}: " + (f"{done.ms:.1f} ms/step" if done.ms else
                                     f"{done.status} {done.error}".strip()), flush=True)
