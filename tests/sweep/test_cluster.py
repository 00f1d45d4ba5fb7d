"""`--mode=sweep --launcher=ray` on a real Ray cluster: nodes of this machine on the
loopback interface (ray.cluster_utils.Cluster), each carrying its own machine label
(`machine:alpha`, `machine:beta` custom resources), running real cells (child
`python -m mpt.main` runs) as Ray tasks. Skipped where Ray is not installed (the
`cluster` extra); CI installs it."""

import contextlib
import dataclasses
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from mpt import main
from mpt.machine import isa
from mpt.records import cells
from mpt.records import summary
from mpt.sweep import cluster as sweep_cluster
from mpt.sweep import run as sweep

from test_sweep import tiny_sweep
import helpers
from helpers import ROOT, TINY_FLAGS, wait_for

# Found, not imported: Ray reads its loopback switch when imported (the fixture).
if importlib.util.find_spec("ray") is None:
  pytest.skip("Ray is not installed (the `cluster` extra)", allow_module_level=True)

pytestmark = pytest.mark.slow
# The module's cluster (`alpha`) is one per xdist worker that runs one of its two
# tests: a live Ray cluster cannot be shared between worker processes (the suite's
# --dist=worksteal ignores xdist_group marks, so none is set).


# Ray's logical memory of each node (what it lets its tasks reserve), set here so that
# nothing depends on this machine's RAM: beta's holds no mpt process (one has TF loaded).
ALPHA_MEMORY, BETA_MEMORY = 8 * 2**30, 200 * 2**20


@contextlib.contextmanager
def _node_env(**variables):
  """The environment a node starts with, which its workers inherit: without the
  session's OOM-kill counters, so that a cell sees them only as a real node's cell
  would see its own, through its task (cluster.FORWARDED)."""
  with pytest.MonkeyPatch.context() as env:
    env.delenv("MPT_OOM_KILLS", raising=False)
    for name, value in variables.items():
      env.setenv(name, value)
    yield


@pytest.fixture(scope="module")
def alpha():
  """The cluster: a head node `alpha` (one CPU, one GPU as far as Ray knows: none is
  used, the cells find no GPU and train on the CPU). Each test adds the other nodes
  it needs (`beta`) and removes them."""
  with pytest.MonkeyPatch.context() as env:
    # Ray's single-machine mode, every server on loopback: read by Ray when imported
    # (this worker's Ray if imported already, else the import below) and by the
    # nodes' processes.
    env.setenv(sweep_cluster.LOOPBACK_ENV, "0")
    from ray import cluster_utils
    from ray._private import ray_constants
    env.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
    # Ray checks a GPU count against the devices CUDA lets it see (the suite hides
    # all): it sees an id, 99, which no CUDA device has, so a cell granted it trains
    # on the CPU even on a GPU host.
    with _node_env(CUDA_VISIBLE_DEVICES="99"):
      cluster = cluster_utils.Cluster(
          initialize_head=True, head_node_args={
              "num_cpus": 1, "num_gpus": 1, "memory": ALPHA_MEMORY,
              "include_dashboard": False, "resources": {"machine:alpha": 1},
              # A killed node is counted dead after 3 missed health checks a second
              # apart, not Ray's 5 three seconds apart: sooner, for the node-lost
              # test's cells that wait for it.
              "_system_config": {"health_check_period_ms": 1000,
                                 "health_check_failure_threshold": 3}})
    yield cluster
    cluster.shutdown()


@pytest.fixture
def beta(alpha):
  """A second node, `beta` (one CPU, no GPU), removed after the test (if the test has
  not): the cluster is alpha alone again, Ray's own view included."""
  with _node_env():
    node = alpha.add_node(num_cpus=1, num_gpus=0, memory=BETA_MEMORY,
                          resources={"machine:beta": 1})
  yield node
  if node in alpha.worker_nodes:
    alpha.remove_node(node)
  alpha.wait_for_nodes()  # No node the next test's sweep still sees alive.


def test_a_sweep_runs_every_cell_on_each_machine_then_resumes(alpha, beta, tmp_path,
                                                              monkeypatch, capsys):
  # On each machine (the injection reaches the nodes' cells through the task's
  # environment), before its first step: batch 8 under mixed_bfloat16 runs out of
  # memory; float32 at 8 is SIGKILLed as the kernel's OOM killer does, counting it in
  # the session's stand-in counters (which reach the node only with the task); and
  # mixed_bfloat16 at 4 fails (a bug).
  monkeypatch.setenv("MPT_INJECT_FAULT",
                     "oom:8/mixed_bfloat16,kill:8/float32,fail:4/mixed_bfloat16")
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,8", policies="float32,mixed_bfloat16",
                         launcher="ray", ray_address=alpha.address, machines="all")
  result = sweep.run(cfg, opts)
  out = sweep.sweep_dir(cfg, opts)
  rows = cells.read_csv(out / "sweep.csv")
  assert len(rows) == 8 and result["cells"] == 8
  assert result["cells_not_completed"] == 1 and main.exit_status(result) == 6
  by = {(r.machine, r.batch_size, r.policy): r for r in rows}
  assert len(by) == 8
  # Alpha: every cell ran, each ending as injected. Beta: its pilot ran; the others'
  # estimates exceed the memory beta offers: predicted, not started.
  alpha_ends = {(4, "float32"): "ok", (4, "mixed_bfloat16"): "failed",
                (8, "float32"): "OOM", (8, "mixed_bfloat16"): "OOM"}
  assert {k: r.status for k, r in by.items()} == {
      ("alpha", b, p): alpha_ends[b, p]
      for b in (4, 8) for p in ("float32", "mixed_bfloat16")} | {
      ("beta", b, p): "ok" if (b, p) == (4, "float32") else "OOM (predicted)"
      for b in (4, 8) for p in ("float32", "mixed_bfloat16")}
  # The SIGKILL told apart by the counters read on its node: an OOM, not a kill from
  # outside.
  assert by["alpha", 8, "float32"].error.startswith(
      "the training process died of SIGKILL while training: the kernel counted an OOM "
      "kill")
  assert by["alpha", 4, "mixed_bfloat16"].error == (
      "RuntimeError: injected failure (MPT_INJECT_FAULT=fail:4/mixed_bfloat16)")
  ran = [r for r in rows if r.status != "OOM (predicted)"]
  for r in ran:  # Each run folder came back from its node, under the sweep folder.
    assert r.run_dir == str(out / "cells" / r.id) and r.id.endswith(f"_on_{r.machine}")
    assert (out / "cells" / r.id / "flags.txt").exists()
    assert r.cpu  # Read on the node.
    # Ray hid beta's (absent) GPUs; each alpha cell had alpha's one GPU to itself.
    assert r.granted_gpus == (1.0 if r.machine == "alpha" else None)
  # The pilots asked for no memory; the rest of alpha's cells for their preflight
  # estimate, as the pilot's summary.json recorded it, and Ray reserved it.
  plan = summary.read(out / "cells" / by["alpha", 4, "float32"].id / "summary.json").memory
  assert by["alpha", 4, "float32"].granted_memory_mb is None
  for (m, b, p), r in by.items():
    if m == "alpha" and (b, p) != (4, "float32"):
      assert r.granted_memory_mb == pytest.approx(plan.policies[p].total_mb(b), abs=0.2)
    if r.status == "OOM (predicted)":
      assert "no node of beta offers more than 200 MiB of Ray memory" in r.error
  assert all(r.ms_per_step > 0 for r in rows if r.status == "ok")
  table = (out / "sweep.md").read_text()
  assert "on alpha: ms/step" in table and "on beta: ms/step" in table
  from matplotlib import image
  assert image.imread(out / "sweep.png").shape[0] == 2 * 400  # A row of panels each.
  assert "the cluster at" in capsys.readouterr().out  # Said once: a trusted network.

  # The same command again, with a --cell_timeout (not part of the sweep's name) and
  # no faults: only the failed cell runs again, and its node kills it at the timeout
  # (a run takes longer than 0.5 s to start); the others, in sweep.csv, do not run.
  monkeypatch.delenv("MPT_INJECT_FAULT")
  again = sweep.run(cfg, dataclasses.replace(opts, cell_timeout=0.5))
  assert "1 cells as Ray tasks" in capsys.readouterr().out
  rows = cells.read_csv(out / "sweep.csv")
  assert again["cells"] == 8 and len(rows) == 8 and main.exit_status(again) == 6
  rerun = {(r.machine, r.batch_size, r.policy): r for r in rows}
  statuses = {k: r.status for k, r in by.items()}
  assert {k: r.status for k, r in rerun.items()} == statuses | {
      ("alpha", 4, "mixed_bfloat16"): "timeout"}
  assert rerun["alpha", 4, "mixed_bfloat16"].error == "killed after 0.5 s"


def test_a_node_lost_mid_sweep_leaves_its_cells_failed(alpha, beta, tmp_path):
  # Every node here sees the logdir: the cells write their run folders there.
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4", policies="float32,mixed_bfloat16",
                         launcher="ray", ray_address=alpha.address, machines="all",
                         shared_logdir=True)
  out = sweep.sweep_dir(cfg, opts)
  # Beta goes down once its own first cell is running (the cell's child has begun its
  # run): its pilot, while beta's other cell waits for it.
  lost, ended = threading.Event(), threading.Event()

  def lose_beta():
    on_beta = lambda: any("mpt.main" in _cmd(p) and "_on_beta" in _cmd(p)
                          for p in _children())
    if wait_for(lambda: ended.is_set() or on_beta(), 120) and not ended.is_set():
      alpha.remove_node(beta, allow_graceful=False)
      lost.set()

  killer = threading.Thread(target=lose_beta)
  killer.start()
  try:
    result = sweep.run(cfg, opts)
  finally:
    ended.set()
    killer.join()
  assert lost.is_set(), "beta's cell never started"
  rows = cells.read_csv(out / "sweep.csv")
  by = {(r.machine, r.policy): r for r in rows}
  assert len(rows) == 4 == len(by)  # Never lost, never twice.
  assert {by["alpha", p].status for p in ("float32", "mixed_bfloat16")} == {"ok"}
  for p in ("float32", "mixed_bfloat16"):  # Written by the cell's own run, not copied.
    flags = (out / "cells" / by["alpha", p].id / "flags.txt").read_text().splitlines()
    assert f"--logdir={out.resolve() / 'cells'}" in flags
  # The pilot, lost under it (the task's error); the cell it held, released and then
  # failed for want of any node of beta, rather than waiting for ever.
  assert {by["beta", p].status for p in ("float32", "mixed_bfloat16")} == {"failed"}
  assert by["beta", "float32"].error.startswith("node lost (")
  assert by["beta", "mixed_bfloat16"].error == "node lost: no node of beta is left"
  assert result["cells_not_completed"] == 2 and main.exit_status(result) == 6


def test_a_node_without_a_label_is_named_by_the_cpu_it_reads_itself(alpha):
  """A node that carries no `machine:NAME` resource is named by its CPU model and
  GPUs, read on that node (usage.md): here `gamma` reads another recorded cpuinfo
  than this process does, so only a probe run on gamma can name it so."""
  import ray
  broadwell = helpers.CPUINFO / "intel_broadwell_avx2.txt"
  [model] = re.findall(r"^model name\s*:\s*(.+)$", broadwell.read_text(), re.M)[:1]
  with _node_env(MPT_CPUINFO=str(broadwell)):
    gamma = alpha.add_node(num_cpus=1, num_gpus=0, memory=BETA_MEMORY)
  try:
    ray.init(address=alpha.address, log_to_driver=False)
    try:
      named = sweep_cluster.machines(ray, "all")
    finally:
      ray.shutdown()
  finally:
    alpha.remove_node(gamma)
    alpha.wait_for_nodes()
  assert model != isa.detect().name  # This process' stand-in CPU is another one.
  assert sorted(named) == sorted(["alpha", model]), named
  assert len(named["alpha"].nodes) == len(named[model].nodes) == 1
  assert "scheduling_strategy" in named[model].options  # Pinned to gamma itself.


def _children():
  import psutil
  return psutil.Process().children(recursive=True)


def _running(p) -> bool:
  """Whether a process still runs (a zombie has ended: its parent, maybe init in a
  container, has not reaped it yet)."""
  import psutil
  try:
    return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
  except psutil.Error:
    return False


def _cmd(p) -> str:
  """A process' command line; "" for one gone meanwhile (or a zombie)."""
  import psutil
  try:
    return " ".join(p.cmdline())
  except psutil.Error:
    return ""


@pytest.mark.parametrize("ignored", [False, True], ids=["terminal", "background"])
def test_ctrl_c_stops_the_cells_and_the_local_cluster_listens_on_loopback_only(
    tmp_path, ignored):
  """The command line's own cluster (no --ray_address): every socket its processes
  listen on is on loopback; Ctrl-C stops the running cells at a step and the cluster,
  also where the sweep was started with SIGINT ignored (`... &` in a script, nohup,
  CI runners), which Ray's workers inherit: the cell ends by the signal, at a step,
  not killed when the grace runs out (cluster.STOP_GRACE_S)."""
  import psutil
  proc = subprocess.Popen(
      [sys.executable, "-m", "mpt", "--mode=sweep", "--launcher=ray",
       "--batch_sizes=4", "--policies=float32", "--epochs=100000", "--steps_per_epoch=2",
       f"--data_dir={tmp_path}/data", f"--logdir={tmp_path}/logs", *TINY_FLAGS],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True, env={k: v for k, v in os.environ.items()
                                   if k != sweep_cluster.LOOPBACK_ENV},
      preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignored
      else None)
  me = psutil.Process(proc.pid)
  try:
    running = lambda: [p for p in me.children(recursive=True) if "mpt.main" in _cmd(p)]
    # The cell's run has begun: its supervisor and training child both exist.
    assert wait_for(lambda: len(running()) >= 2, 120), "no cell started"
    listening = [(p.name(), c.laddr) for p in [me] + me.children(recursive=True)
                 for c in _listening(p)]
    assert listening and all(_loopback(a.ip) for _, a in listening), listening
    # Every process of the sweep now: the cell's, and Ray's own (gcs_server, raylet,
    # workers, agents), which carry nothing of this test in their command lines.
    kids = me.children(recursive=True)
    proc.send_signal(signal.SIGINT)
    stopping = time.monotonic()
    out, err = proc.communicate(timeout=120)
    stopped_in = time.monotonic() - stopping
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, err[-3000:]
  rows = cells.read_csv(next((tmp_path / "logs").glob("sweep-*")) / "sweep.csv")
  # Stopped by the signal at a step, not force-killed when the grace ran out.
  assert [(r.status, r.error) for r in rows] == [("interrupted", "SIGINT")], rows
  assert stopped_in < sweep_cluster.STOP_GRACE_S, stopped_in
  assert "sweep interrupted" in out
  # Nothing left: neither the cluster nor the cell (as psutil.wait_procs, but a
  # zombie, ended and not yet reaped, counts as gone).
  wait_for(lambda: not any(_running(p) for p in kids), 30)
  assert not [(p.pid, _cmd(p)) for p in kids if _running(p)]
  assert not [p for p in psutil.process_iter(["cmdline"])
              if tmp_path.name in " ".join(p.info["cmdline"] or [])]


def _listening(p):
  import psutil
  try:
    return [c for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
  except psutil.Error:
    return []


def _loopback(ip: str) -> bool:
  import ipaddress
  address = ipaddress.ip_address(ip.split("%")[0])
  mapped = getattr(address, "ipv4_mapped", None)
  return (mapped or address).is_loopback
