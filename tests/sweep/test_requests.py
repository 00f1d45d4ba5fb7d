"""What a sweep cell asks its Ray node for (mpt/sweep/requests.py), without Ray: the
pilot of each machine, model and image size, the cells held for it and released with
the memory its summary.json estimated, the cells no node can hold, GPUs; what the
driver submits each cell with, and how it stops and fails tasks (mpt/sweep/cluster.py,
on a stand-in Ray); the checks of the flags before any cell runs, and the one line
where Ray is not installed. tests/sweep/test_cluster.py runs the same on a real Ray
cluster."""

import csv
import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

from mpt.errors import UserError
from mpt.records import cells as cells_lib
from mpt.records import summary as summary_lib
from mpt.records.cells import Cell
from mpt.records.memory import Estimate, Line, MemoryPlan
from mpt.sweep import cluster
from mpt.sweep import requests
from mpt.sweep import run as sweep

from test_sweep import tiny_sweep
from helpers import ROOT, TINY_FLAGS

# A plan as a cell's preflight records it: float32 500 MB + 10 MB per example.
LINES = {"float32": Line(500.0, 10.0, 400.0), "mixed_bfloat16": Line(450.0, 6.0, 400.0)}


def cell(machine="m", batch=4, policy="float32", **kw) -> Cell:
  return Cell(model="small", image_size=16, batch_size=batch, policy=policy,
              loop="fit", machine=machine, **kw)


def ended_ok(c: Cell, tmp_path) -> Cell:
  """`c` ended ok, its run folder holding a summary.json with the plan LINES."""
  folder = tmp_path / c.id
  folder.mkdir()
  plan = MemoryPlan(Estimate(c.policy, c.batch_size, 400, 1, 1, 2, 0, 5, 5),
                    policies=LINES)
  summary_lib.RunSummary(status="completed", memory=plan).write(folder / "summary.json")
  return dataclasses.replace(c, status="ok", run_dir=str(folder))


def planner(memory_mb=4096.0, gpus=0.0, cell_gpus="auto", force=False):
  return requests.Planner(2, cell_gpus, force,
                          {"m": requests.Place({"resources": {"machine:m": 0.001}},
                                               memory_mb, gpus, most_gpus=gpus)})


def test_the_pilot_runs_alone_then_the_rest_ask_for_their_estimate(tmp_path):
  p = planner()
  pilot, b8, b64 = cell(), cell(batch=8), cell(batch=64, policy="mixed_bfloat16")
  assert p.take(pilot) == {"num_cpus": 2, "num_gpus": 0.0,
                           "resources": {"machine:m": 0.001}}  # No memory asked.
  custom = dataclasses.replace(pilot, loop="custom")
  assert [p.take(c) for c in (b8, b64, custom)] == [None] * 3  # Held for its plan.
  assert p.ended(ended_ok(pilot, tmp_path)) == [b8, b64, custom]
  assert p.ended(ended_ok(b8, tmp_path)) == []  # Not a pilot: releases none.
  assert p.take(b8)["memory"] == int((500 + 8 * 10) * 2**20)
  assert p.take(b64)["memory"] == int((450 + 64 * 6) * 2**20)


def test_another_machine_or_image_size_has_its_own_pilot(tmp_path):
  p = requests.Planner(1, "auto", False, {"m": requests.Place({}, 4096),
                                          "n": requests.Place({}, 4096)})
  pilot = {"num_cpus": 1, "num_gpus": 0.0}  # Submitted, asking for no memory.
  assert p.take(cell()) == pilot
  assert p.take(cell(machine="n")) == pilot
  assert p.take(dataclasses.replace(cell(), image_size=32)) == pilot
  assert p.take(cell(batch=8)) is None  # Held for m's 16 px pilot.


def test_a_cell_no_node_can_hold_is_predicted_not_started(tmp_path):
  p = planner(memory_mb=1000.0)
  pilot = cell()
  p.take(pilot)
  p.ended(ended_ok(pilot, tmp_path))
  assert "memory" in p.take(cell(batch=50))  # 500 + 500 MB: fits 1000.
  ended = p.take(cell(batch=51))
  assert isinstance(ended, Cell) and ended.status == "OOM (predicted)"
  assert ended.error == ("needs ~1010 MiB (the preflight's estimate); no node of m "
                         "offers more than 1000 MiB of Ray memory")
  forced = planner(memory_mb=1000.0, force=True)  # --force: no request, no prediction.
  assert "memory" not in forced.take(cell(batch=51))
  assert "memory" not in forced.take(cell(batch=52))


def test_a_failed_pilot_releases_its_group_without_memory_requests():
  p = planner()
  pilot, rest = cell(), [cell(batch=8), cell(batch=16)]
  p.take(pilot)
  assert [p.take(c) for c in rest] == [None, None]
  assert p.ended(dataclasses.replace(pilot, status="failed")) == rest
  assert all("memory" not in p.take(c) for c in rest)  # Each runs; none waits.


def test_more_gpus_than_any_node_has_fail_the_cell_not_wait_for_ever():
  ended = planner(gpus=0.0, cell_gpus="1").take(cell())
  assert isinstance(ended, Cell) and ended.status == "failed"
  assert ended.error == "--cell_gpus: asks for 1 GPU(s); no node of m has more than 0"


def test_a_cell_given_no_gpu_sees_none(tmp_path, monkeypatch):
  seen = []
  monkeypatch.setattr(cluster.cell_lib, "run_cell",
                      lambda cfg, c, out, timeout, env: seen.append(env) or c)
  cfg, _ = tiny_sweep(tmp_path)
  cluster._run_on_node(cfg, cell(), None, None)  # No Ray here: no GPU granted.
  assert seen[0]["CUDA_VISIBLE_DEVICES"] == ""
  # Nor a Ray instance started in this process (a later ray.init here would fail).
  assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
  monkeypatch.setattr(cluster, "_granted", lambda: {"granted_gpus": 1.0})
  cluster._run_on_node(cfg, cell(), None, None)
  assert seen[1] is None  # Ray's own CUDA_VISIBLE_DEVICES, inherited.


def test_a_shared_run_folder_is_left_where_its_node_wrote_it(tmp_path):
  folder = tmp_path / "elsewhere" / "cells" / "c"
  folder.mkdir(parents=True)
  done = cell(status="ok", run_dir=str(folder))
  assert cluster._landed(done, b"", pathlib.Path("logs/relative"), shared=True) == done
  assert folder.is_dir()


def test_a_gpu_machine_gives_each_cell_one_gpu_unless_told():
  assert planner(gpus=4.0).take(cell())["num_gpus"] == 1.0
  assert planner(gpus=0.0).take(cell())["num_gpus"] == 0.0
  assert planner(gpus=4.0, cell_gpus="2").take(cell())["num_gpus"] == 2.0
  assert planner(gpus=1.0, cell_gpus="0.5").take(cell())["num_gpus"] == 0.5
  for bad in ("x", "-1"):
    with pytest.raises(UserError, match="--cell_gpus: .* neither `auto` nor a number"):
      requests.parse_gpus(bad)


def test_a_node_offering_no_memory_figure_gets_no_memory_request():
  p = planner(memory_mb=0.0)
  for c in (cell(), cell(batch=8)):  # No pilot either: none is held.
    r = p.take(c)
    assert r == {"num_cpus": 2, "num_gpus": 0.0, "resources": {"machine:m": 0.001}}
    assert "memory" not in r


class InlineRay:
  """Ray as the sweep's driver uses it, each task ending `ok` at once; `submitted`
  keeps what each was submitted with: (its options, its timeout, its variables)."""

  class exceptions:  # Never raised here.
    RayError = TaskCancelledError = type("NeverRaised", (Exception,), {})

  def __init__(self):
    self.submitted, self.results = [], {}

  def nodes(self):
    return [{"NodeID": "n", "Alive": True, "Resources": {"CPU": 8.0}}]

  def remote(self, **_):
    return lambda function: Task(self, {})

  def wait(self, refs, num_returns, timeout):
    return refs[:num_returns], refs[num_returns:]

  def get(self, ref):
    return self.results[ref]


@dataclasses.dataclass
class Task:
  ray: InlineRay
  how: dict

  def options(self, **how):
    return Task(self.ray, how)

  def remote(self, cfg, c, timeout, shared):
    env = self.how.pop("runtime_env")["env_vars"]
    self.ray.submitted.append((self.how, timeout, env))
    self.ray.results[len(self.ray.submitted)] = (dataclasses.replace(c, status="ok"), b"")
    return len(self.ray.submitted)


def test_each_cell_asks_for_cell_cpus_and_takes_its_timeout_and_variables(
    tmp_path, monkeypatch):
  """What the driver submits a cell with: --cell_cpus CPUs (as many cells at once as
  a node's CPUs hold), --cell_timeout for its node to kill it by, and the variables
  its child must see there (the OOM-kill counters: how a SIGKILL is told apart)."""
  monkeypatch.setattr(cluster, "machines", lambda ray, which: {"": requests.Place({})})
  monkeypatch.setenv("MPT_INJECT_FAULT", "fail:8")
  monkeypatch.delenv("MPT_KILL_AT", raising=False)
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,8", launcher="ray", cell_cpus=3,
                         cell_timeout=7.5)
  ray = InlineRay()
  done, stopped = cluster._submit_and_collect(ray, cfg, opts, sweep.cells(cfg, opts),
                                              {}, tmp_path)
  assert [(c.batch_size, c.status) for c in done] == [(4, "ok"), (8, "ok")]
  assert ray.submitted == [({"num_cpus": 3, "num_gpus": 0.0}, 7.5, {
      "MPT_INJECT_FAULT": "fail:8", "MPT_OOM_KILLS": os.environ["MPT_OOM_KILLS"]})] * 2


class NodeGone:
  """Ray as the driver sees it once node `b` is dead."""

  def __init__(self):
    self.cancelled = []

  def nodes(self):
    return [{"NodeID": "b", "Alive": False, "Resources": {}}]

  def cancel(self, ref, force=False):
    self.cancelled.append((ref, force))


def test_a_machine_with_no_node_left_fails_its_cells_at_the_second_check(tmp_path):
  # The first check can come as soon as Ray counts the node dead, before a cell that
  # was running there has its own error ("node lost (...)"); the next, WAIT_S later,
  # fails what is still waiting for that machine.
  ray, places = NodeGone(), {"beta": requests.Place({}, nodes=("b",))}
  pending, stranded, finished = {"task": cell(machine="beta")}, set(), {}
  assert cluster._fail_stranded(ray, places, pending, tmp_path, finished, stranded) == []
  assert list(pending) == ["task"] and ray.cancelled == []
  [failed] = cluster._fail_stranded(ray, places, pending, tmp_path, finished, stranded)
  assert failed.status == "failed" and failed.error == "node lost: no node of beta is left"
  assert pending == {} and ray.cancelled == [("task", True)]
  assert cells_lib.read_csv(tmp_path / "sweep.csv") == [failed]


def test_a_place_is_what_its_nodes_offer():
  nodes = [{"Resources": {"memory": 3 * 2**30, "GPU": 2.0}},
           {"Resources": {"memory": 2**30, "GPU": 1.0}}]
  nodes[0]["NodeID"], nodes[1]["NodeID"] = "a", "b"
  assert requests.place(nodes, {"x": 1}) == requests.Place({"x": 1}, 3072.0, 1.0,
                                                           ("a", "b"), 2.0)


def test_a_shared_logdir_a_node_cannot_see_fails_the_cell_in_one_line(tmp_path):
  cfg, _ = tiny_sweep(tmp_path)
  done, archive = cluster._run_on_node(cfg, cell(), None, tmp_path / "not-mounted")
  assert archive == b"" and done.status == "failed"
  assert done.error == (f"--shared_logdir: {tmp_path / 'not-mounted'} is not on this "
                        "node: --logdir must be a path every node sees at the same place")


@pytest.mark.parametrize("flags, message", [
    (dict(shared_logdir=True), "--shared_logdir need --launcher=ray"),
    (dict(launcher="ray", cell_gpus="one"), "--cell_gpus: 'one' is neither")])
def test_the_flags_are_checked_before_any_cell(tmp_path, flags, message):
  cfg, opts = tiny_sweep(tmp_path, **flags)
  with pytest.raises(UserError, match=message):
    sweep.run(cfg, opts)
  assert not (tmp_path / "logs").exists()


def test_a_resumed_sweep_csv_keeps_the_columns_it_began_with(tmp_path):
  path = tmp_path / "sweep.csv"
  old = cells_lib.COLUMNS[:cells_lib.COLUMNS.index("machine") + 1]
  with path.open("w", newline="") as f:  # As an mpt before granted_* wrote it.
    writer = csv.DictWriter(f, old, extrasaction="ignore")
    writer.writeheader()
    writer.writerow(cell(status="ok").to_row())
  cells_lib.append_csv(path, cell(batch=8, status="ok", granted_memory_mb=12.5))
  rows = list(csv.reader(path.open()))
  assert {len(r) for r in rows} == {len(old)}  # No ragged row.
  assert [c.batch_size for c in cells_lib.read_csv(path)] == [4, 8]


class LosingRay:
  """Ray as the sweep's driver sees it, losing the first `lose` cancels of a running
  task (as Ray 2.60 was seen to, once): the task ends only once a cancel reaches it.
  A wait for a task that does not end lasts its timeout on `clock`."""

  def __init__(self, lose: int):
    self.lose, self.cancels, self.ended = lose, [], set()
    self.clock = Clock()

  def cancel(self, ref, force=False):
    self.cancels.append((ref, force))
    if len(self.cancels) > self.lose:
      self.ended.add(ref)

  def wait(self, refs, num_returns, timeout):
    left = [r for r in refs if r not in self.ended]
    if left:
      self.clock.now += timeout
    return [r for r in refs if r in self.ended], left


class Clock:
  """`time` as stop_tasks reads it: only the fake Ray's waits move it, so that the
  grace is passed by the waits, not by how fast this machine runs the test."""

  def __init__(self):
    self.now = 0.0

  def monotonic(self) -> float:
    return self.now


def test_a_stop_cancels_again_a_task_the_first_cancel_missed(monkeypatch):
  ray = LosingRay(lose=1)
  monkeypatch.setattr(cluster, "time", ray.clock)
  cluster.stop_tasks(ray, ["cell"])
  assert ray.cancels == [("cell", False), ("cell", False)]  # Not forced: it stops at a step.
  # Cancelled every RECANCEL_S (10 s), forced only once the grace has passed.
  monkeypatch.setattr(cluster, "STOP_GRACE_S", 25.0)
  ray = LosingRay(lose=3)
  monkeypatch.setattr(cluster, "time", ray.clock)
  cluster.stop_tasks(ray, ["cell"])
  assert ray.cancels == [("cell", False)] * 3 + [("cell", True)]  # At 0, 10, 20; 30.


def test_a_second_stop_kills_the_tasks_at_once(monkeypatch):
  monkeypatch.setattr(cluster, "RECANCEL_S", 0.0)
  ray = LosingRay(lose=1)
  waits = ray.wait
  ray.wait = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt) \
      if len(ray.cancels) == 1 else waits(*a, **k)
  try:
    cluster.stop_tasks(ray, ["cell"])
  except KeyboardInterrupt:  # Would end pytest itself, not fail this test.
    pytest.fail("the second stop escaped stop_tasks: the cells left unrecorded")
  assert ray.cancels == [("cell", False), ("cell", True)]


def test_without_ray_the_launcher_is_one_line(tmp_path):
  # Here, not in test_cluster.py: that module is skipped exactly where Ray is absent.
  env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
  (tmp_path / "ray").mkdir()
  (tmp_path / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
  proc = subprocess.run([sys.executable, "-m", "mpt", "--mode=sweep", "--launcher=ray",
                         f"--logdir={tmp_path}/logs", *TINY_FLAGS], cwd=ROOT,
                        capture_output=True, text=True, timeout=120, env=env)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines() == [
      "mpt: error: --launcher=ray needs Ray, which is not installed: pip install -e "
      "'.[cluster]' (or --launcher=local)"]
