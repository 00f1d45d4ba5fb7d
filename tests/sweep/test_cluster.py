"""`--mode=sweep --launcher=ray` on a real Ray cluster: two nodes of this machine on the
loopback interface (ray.cluster_utils.Cluster), each carrying its own machine label
(`machine:alpha`, `machine:beta` custom resources), running real cells (child
`python -m mpt.main` runs) as Ray tasks. Skipped where Ray is not installed (the
`cluster` extra); CI installs it."""

import os
import signal
import subprocess
import sys

import pytest

from mpt import main
from mpt.records import cells
from mpt.records import summary
from mpt.sweep import cluster as sweep_cluster
from mpt.sweep import run as sweep

from test_sweep import tiny_sweep
from helpers import ROOT, TINY_FLAGS, wait_for

# Ray's single-machine mode, before Ray is imported here: every server on loopback.
os.environ[sweep_cluster.LOOPBACK_ENV] = "0"
ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.slow


# Ray's logical memory of each node (what it lets its tasks reserve), set here so that
# nothing depends on this machine's RAM: beta's holds no mpt process (one has TF loaded).
ALPHA_MEMORY, BETA_MEMORY = 8 * 2**30, 200 * 2**20


@pytest.fixture(scope="module")
def two_machines():
  """A head node `alpha` (one CPU, one GPU as far as Ray knows: none is used, the
  cells find no GPU and train on the CPU) and a second node `beta` (one CPU)."""
  # Ray checks a GPU count against the devices CUDA lets it see (the suite hides all).
  with pytest.MonkeyPatch.context() as env:
    env.setenv("CUDA_VISIBLE_DEVICES", "0")
    cluster = cluster_utils.Cluster(
        initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": 1, "memory": ALPHA_MEMORY,
            "include_dashboard": False, "resources": {"machine:alpha": 1}})
  beta = cluster.add_node(num_cpus=1, memory=BETA_MEMORY,
                          resources={"machine:beta": 1})
  yield cluster, beta
  cluster.shutdown()


def test_a_sweep_runs_every_cell_on_each_machine_then_resumes(two_machines, tmp_path,
                                                              monkeypatch, capsys):
  cluster, _ = two_machines
  # On each machine batch 8 under mixed_bfloat16 runs out of memory (as injected); the
  # injection reaches the nodes' cells through the task's environment.
  monkeypatch.setenv("MPT_INJECT_FAULT", "oom:8/mixed_bfloat16")
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4,8", policies="float32,mixed_bfloat16",
                         launcher="ray", ray_address=cluster.address, machines="all")
  result = sweep.run(cfg, opts)
  out = sweep.sweep_dir(cfg, opts)
  rows = cells.read_csv(out / "sweep.csv")
  assert len(rows) == 8 and result["cells"] == 8 and main.exit_status(result) == 0
  by = {(r.machine, r.batch_size, r.policy): r for r in rows}
  assert len(by) == 8
  # Alpha: every cell ran (the injected OOM recorded as OOM). Beta: its pilot ran; the
  # others' estimates exceed the memory beta offers: predicted, not started.
  assert {k: r.status for k, r in by.items()} == {
      ("alpha", b, p): "OOM" if (b, p) == (8, "mixed_bfloat16") else "ok"
      for b in (4, 8) for p in ("float32", "mixed_bfloat16")} | {
      ("beta", b, p): "ok" if (b, p) == (4, "float32") else "OOM (predicted)"
      for b in (4, 8) for p in ("float32", "mixed_bfloat16")}
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

  # The same command again: every cell is in sweep.csv, none runs again.
  again = sweep.run(cfg, opts)
  assert "0 cells as Ray tasks" in capsys.readouterr().out
  assert again["cells"] == 8 and len(cells.read_csv(out / "sweep.csv")) == 8


def test_a_node_lost_mid_sweep_leaves_its_cells_failed(two_machines, tmp_path,
                                                       monkeypatch):
  cluster, beta = two_machines
  # Every node here sees the logdir: the cells write their run folders there.
  cfg, opts = tiny_sweep(tmp_path, batch_sizes="4", policies="float32,mixed_bfloat16",
                         launcher="ray", ray_address=cluster.address, machines="all",
                         shared_logdir=True)
  out = sweep.sweep_dir(cfg, opts)
  # Beta goes down once its first cell is running (its child has begun its run).
  import threading
  killer = threading.Thread(target=lambda: wait_for(
      lambda: any(True for _ in cells_running()), 60) and cluster.remove_node(
          beta, allow_graceful=False))
  cells_running = lambda: (p for p in _children() if "mpt.main" in _cmd(p))
  killer.start()
  result = sweep.run(cfg, opts)
  killer.join()
  rows = cells.read_csv(out / "sweep.csv")
  by = {(r.machine, r.policy): r for r in rows}
  assert len(rows) == 4 == len(by)  # Never lost, never twice.
  assert {by["alpha", p].status for p in ("float32", "mixed_bfloat16")} == {"ok"}
  for p in ("float32", "mixed_bfloat16"):  # Written by the cell's own run, not copied.
    flags = (out / "cells" / by["alpha", p].id / "flags.txt").read_text().splitlines()
    assert f"--logdir={out.resolve() / 'cells'}" in flags
  for p in ("float32", "mixed_bfloat16"):
    assert by["beta", p].status == "failed" and "node lost" in by["beta", p].error
  assert result["cells_not_completed"] == 2 and main.exit_status(result) == 6


def _children():
  import psutil
  return psutil.Process().children(recursive=True)


def _cmd(p) -> str:
  """A process' command line; "" for one gone meanwhile (or a zombie)."""
  import psutil
  try:
    return " ".join(p.cmdline())
  except psutil.Error:
    return ""


def test_ctrl_c_stops_the_cells_and_the_local_cluster_listens_on_loopback_only(tmp_path):
  """The command line's own cluster (no --ray_address): every socket its processes
  listen on is on loopback; Ctrl-C stops the running cells at a step and the cluster."""
  import psutil
  proc = subprocess.Popen(
      [sys.executable, "-m", "mpt", "--mode=sweep", "--launcher=ray",
       "--batch_sizes=4", "--policies=float32", "--epochs=100000", "--steps_per_epoch=2",
       f"--data_dir={tmp_path}/data", f"--logdir={tmp_path}/logs", *TINY_FLAGS],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True, env={k: v for k, v in os.environ.items()
                                   if k != sweep_cluster.LOOPBACK_ENV})
  me = psutil.Process(proc.pid)
  try:
    running = lambda: [p for p in me.children(recursive=True) if "mpt.main" in _cmd(p)]
    # The cell's run has begun: its supervisor and training child both exist.
    assert wait_for(lambda: len(running()) >= 2, 120), "no cell started"
    listening = [(p.name(), c.laddr) for p in [me] + me.children(recursive=True)
                 for c in _listening(p)]
    assert listening and all(_loopback(a.ip) for _, a in listening), listening
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)
  assert proc.returncode == 130, err[-3000:]
  rows = cells.read_csv(next((tmp_path / "logs").glob("sweep-*")) / "sweep.csv")
  assert rows and {r.status for r in rows} == {"interrupted"}
  assert "sweep interrupted" in out
  assert not [p for p in psutil.process_iter(["cmdline"])
              if tmp_path.name in " ".join(p.info["cmdline"] or [])]  # Nothing left.


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


def test_without_ray_the_launcher_is_one_line(tmp_path):
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
