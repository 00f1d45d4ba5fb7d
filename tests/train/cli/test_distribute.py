"""tf.distribute: TF_CONFIG checks, mirrored on logical CPUs in process, and a real
two-worker MultiWorkerMirroredStrategy cluster on 127.0.0.1 in child processes."""

import json
import shutil

import pytest

from mpt import config
from mpt.train.cli import distribute
from mpt.train.cli import run as train
from mpt.errors import UserError

from helpers import (CPU_DEVICES, Forked, local_cluster, mpt_forked, mpt_forked_start,
                     read_scalars)

CLUSTER = {"worker": ["127.0.0.1:20001", "127.0.0.1:20002"]}


def tf_config(cluster=CLUSTER, kind="worker", index=0) -> str:
  return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def test_tf_config_parses_and_names_the_chief():
  assert distribute.parse_tf_config(tf_config(index=1)) == (CLUSTER, "worker", 1)
  assert distribute.is_chief(CLUSTER, "worker", 0)
  assert not distribute.is_chief(CLUSTER, "worker", 1)
  with_chief = {"chief": ["h:1"], **CLUSTER}
  assert distribute.is_chief(with_chief, "chief", 0)
  assert not distribute.is_chief(with_chief, "worker", 0)


@pytest.mark.parametrize("text,words", [
    ("{not json", "TF_CONFIG is not JSON"),
    ('{"task": {"type": "worker", "index": 0}}', 'no "cluster" object'),
    (tf_config({"worker": ["127.0.0.1"]}), "bad address '127.0.0.1'; expected host:port"),
    (tf_config({"worker": ["h:99999"]}), "bad address 'h:99999'"),
    (tf_config({"worker": []}), "must be a non-empty list"),
    (tf_config({"trainer": ["h:1"]}), "unknown job 'trainer'"),
    (tf_config({"worker": ["h:1"], "ps": ["h:2"]}), "ps/evaluator"),
    (json.dumps({"cluster": CLUSTER}), 'no "task"'),
    (tf_config(index=2), "task index 2 is out of range: job 'worker' has 2"),
    (tf_config(kind="chief"), "task type 'chief' is not a job of the cluster"),
])
def test_malformed_tf_config_says_what_is_wrong(text, words):
  with pytest.raises(UserError, match="TF_CONFIG") as e:
    distribute.parse_tf_config(text)
  assert words in str(e.value)


@pytest.mark.parametrize("overrides,env,words", [
    (dict(strategy="ring"), None, "unknown --strategy='ring'; valid: default, mirrored"),
    (dict(strategy="multi_worker"), None, "TF_CONFIG environment variable, which is "
     "not set"),
    (dict(strategy="multi_worker"), "[1, 2]", 'no "cluster" object'),
    (dict(strategy="multi_worker", cpu_devices=2), tf_config(), "--cpu_devices "
     "applies to --strategy=mirrored"),
    (dict(strategy="mirrored", cpu_devices=CPU_DEVICES, batch_size=7), None,
     "--batch_size=7 (the global batch) does not split evenly across 2 replicas; use "
     "a multiple of 2, e.g. 6 or 8"),
    (dict(strategy="mirrored", cpu_devices=3), None, "TensorFlow already started in "
     "this process with 2 logical CPU device(s)"),
])
def test_bad_strategy_input_fails_before_training(tiny, monkeypatch, tmp_path,
                                                  overrides, env, words):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  if env is not None:
    monkeypatch.setenv("TF_CONFIG", env)
  with pytest.raises(UserError) as e:
    train.train_and_evaluate(tiny(**overrides))
  assert words in str(e.value)
  assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


def test_malformed_tf_config_on_the_command_line_is_one_line_exit_2(tmp_path):
  proc = mpt_forked("--strategy=multi_worker", f"--logdir={tmp_path}/logs",
                    env={"TF_CONFIG": '{"cluster": {"worker": ["h"]}}'}, timeout=120)
  assert proc.returncode == 2, proc.stderr
  assert "mpt: error: TF_CONFIG cluster job 'worker' has a bad address 'h'" in proc.stderr
  assert "Traceback" not in proc.stderr and not (tmp_path / "logs").exists()


def per_step_losses(run_dir) -> list[float]:
  """With steps_per_epoch=1, each epoch's train/loss is one step's loss."""
  return [v for _, v in read_scalars(run_dir)["train/loss"]]


# Relative tolerance of the per-step losses over the first 5 steps, mirrored vs one
# device. 16-bit sums over two half batches round differently from one sum over the
# batch, and the differences grow step by step.
TOLERANCE = {"float32": 1e-5, "mixed_bfloat16": 2e-2, "mixed_float16": 2e-2}


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("loop", ["fit", "custom"])
def test_mirrored_on_two_logical_cpus_matches_one_device(tiny, loop, policy):
  # float16: a fixed loss scale. A dynamic one may overflow (and skip a step) on one
  # side only, after which the two runs legitimately differ.
  # Keras' BatchNorm on both sides: synchronized across replicas, only it can be.
  common = dict(loop=loop, policy=policy, epochs=5, steps_per_epoch=1, batchnorm="keras",
                warmup_steps=1, log_every=1, learning_rate=1e-3,
                loss_scale="256" if policy == "mixed_float16" else "dynamic",
                numerics="off")  # One device samples them, two cannot: not compared.
  one = train.train_and_evaluate(tiny(**common))
  two = train.train_and_evaluate(tiny(strategy="mirrored", cpu_devices=CPU_DEVICES,
                                      **common))
  a, b = per_step_losses(one["run_dir"]), per_step_losses(two["run_dir"])
  print(f"{loop} {policy} one device {a} mirrored {b} max rel diff "
        f"{max(abs(x - y) / abs(x) for x, y in zip(a, b)):.2e}")
  assert (one["replicas"], one["per_replica_batch"], one["strategy"]) == (1, 8, "default")
  assert (two["replicas"], two["per_replica_batch"], two["strategy"]) == (2, 4, "mirrored")
  assert two["devices"] == ["/device:CPU:0", "/device:CPU:1"]
  assert b == pytest.approx(a, rel=TOLERANCE[policy])
  # Instrumentation and dtype inspection under the strategy: global images/sec,
  # the same tags as on one device, the policy's dtypes in the report.
  assert two["images_per_sec"] == pytest.approx(8 / two["ms_per_step"] * 1e3)
  # (util/ tags come from a sampler ticking every second: a run of a few steps may
  # end before its first tick on one side only, so they are left out.)
  tags = lambda run: {t for t in read_scalars(run) if not t.startswith("util/")}
  assert tags(two["run_dir"]) == tags(one["run_dir"])
  report = json.loads(open(f"{two['run_dir']}/dtypes.json").read())
  assert report["policy"] == policy and report["gradients_match_variables"]
  if policy == "mixed_float16":
    assert two["loss_scale"] == one["loss_scale"]
  # The step's FLOPs, counted from each replica's ops: the global batch's, as on one.
  flops = lambda run: json.loads(open(f"{run}/summary.json").read())["flops_matmul"]
  assert flops(two["run_dir"]) == pytest.approx(flops(one["run_dir"]), rel=1e-6)


def test_per_replica_batchnorm_statistics_differ_from_one_device(tiny):
  """Why --sync_batchnorm is the default: per-replica statistics change the loss."""
  common = dict(loop="custom", epochs=2, steps_per_epoch=1, instrument=False)
  one = train.train_and_evaluate(tiny(**common))
  local = train.train_and_evaluate(tiny(strategy="mirrored", cpu_devices=CPU_DEVICES,
                                        sync_batchnorm=False, **common))
  assert per_step_losses(local["run_dir"])[0] != pytest.approx(
      per_step_losses(one["run_dir"])[0], rel=1e-3)


# Per fault, the cluster's --collective_timeout. A dead worker must be noticed without
# it (by TF's heartbeats, ~10 s, or its closed connection), so it is set far beyond
# them; a hung worker still sends heartbeats and only the timeout notices it: one the
# test waits out, well above a step of this tiny model even under load. 5 s was not:
# the resumed cluster (flags.txt replays the timeout) missed it on a loaded 2-core
# host (exit 130, DEADLINE_EXCEEDED), 1 run of 3 on a Zen 4 on 2026-12-06.
COLLECTIVE_TIMEOUT = {"end:3": 120, "hang:3": 20}


@pytest.mark.slow
@pytest.mark.parametrize("loop,fault", [("custom", "end:3"), ("fit", "hang:3")])
def test_a_worker_that_dies_or_hangs_stops_the_cluster_which_then_resumes(
    tmp_path, loop, fault, request):
  """Two local workers train one run, and only the chief writes its folder. Worker 1
  dies (SIGKILL: TF's heartbeats notice) or stops answering (alive, never at the
  next collective: --collective_timeout notices) after step 3. The chief stops
  at that step, saying in summary.json (`interrupted`) which of the two noticed, and
  both workers, restarted with --resume, finish the run from the chief's checkpoint
  2 as one device would have trained it."""
  flags = ["--image_size=16", "--batch_size=4", "--synthetic_train=20",
           "--synthetic_val=10", "--synthetic_px=20", "--epochs=3",
           "--checkpoint_every=2", f"--loop={loop}", f"--data_dir={tmp_path}/data",
           "--verbose=0", "--deterministic",
           "--batchnorm=keras"]  # Synchronized across workers: Keras' layer, as here.
  one = train.train_and_evaluate(config.from_flagfile(
      "\n".join(flags + [f"--logdir={tmp_path}/one"])))

  scratch = tmp_path / "tmp"
  scratch.mkdir()

  def cluster(argv: list[str], kill_at: str = "") -> list[Forked]:
    """Two workers, each a process of its own forked from a server that imported
    TensorFlow (helpers.mpt_forked_start): no import to pay at each of the 4 starts."""
    procs = []
    for index, tf_config in enumerate(local_cluster(2)):
      env = {"TF_CONFIG": tf_config, "TMPDIR": str(scratch)}
      if index == 1 and kill_at:
        env["MPT_KILL_AT"] = kill_at
      procs.append(mpt_forked_start(*argv, env=env))
      started.append(procs[-1])
    return procs

  started = []
  request.addfinalizer(lambda: [p.kill() for p in started])
  chief, worker = cluster(["--strategy=multi_worker",
                           f"--collective_timeout={COLLECTIVE_TIMEOUT[fault]}",
                           f"--logdir={tmp_path}/logs", "--run_name=mw", *flags], fault)
  # Only a guard against a test that would hang: the bound is what noticed, below.
  ended = chief.wait(timeout=240)
  err = ended.stderr
  run = tmp_path / "logs" / "mw"
  summary = json.loads((run / "summary.json").read_text())
  assert ended.returncode == 130 and summary["status"] == "interrupted", err[-3000:]
  # The chief ended on its own: the dead worker by SIGKILL, the hung one still alive.
  assert worker.poll() == (-9 if fault.startswith("end") else None)
  # A hung worker still serves step 3's last all-reduce exchange; a dead one may have
  # died before the chief fetched its share (its own step 3 complete): then the
  # chief's step 3 fails too. No step after the fault: the chief stopped there.
  assert summary["steps"] in ((3,) if fault.startswith("hang") else (2, 3)), summary
  message = summary["message"]
  assert message.startswith(f"mpt: interrupted at step {summary['steps']}: ")
  # What noticed: the timeout for the hung worker only (the dead one's is 120 s).
  noticed = (f"no answer within --collective_timeout={COLLECTIVE_TIMEOUT[fault]} s: "
             if fault.startswith("hang") else "")
  assert ("--collective_timeout" in message) is bool(noticed), message
  assert f"stopped answering ({noticed}" in message, message
  assert f"--resume={run}" in message and message.endswith(f"{run}/checkpoints/ckpt-2)")
  worker.kill()
  for left in scratch.iterdir():  # What the killed worker could not clean up.
    shutil.rmtree(left) if left.is_dir() else left.unlink()

  procs = cluster([f"--resume={run}", "--verbose=0"])
  outs = [proc.wait(timeout=240) for proc in procs]
  for out in outs:
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"resuming {run} at step 2" in out.stdout
  assert "worker:1 is not the chief" in outs[1].stdout
  assert [p for p in (tmp_path / "logs").iterdir() if p.is_dir()] == [run]
  rows = (tmp_path / "logs" / "runs.csv").read_text().splitlines()[1:]
  assert [r.split(",")[2] for r in rows] == ["interrupted", "completed"]  # The chief's.
  assert [p for p in scratch.iterdir() if p.name.startswith("mpt-")] == []  # Worker
  # 1's scratch folder is gone (TF's autograph files are TF's to clean up).
  summary = json.loads((run / "summary.json").read_text())
  assert (summary["status"], summary["task"], summary["workers"], summary["replicas"],
          summary["per_replica_batch"], summary["steps"]) == (
              "completed", "worker:0", 2, 2, 2, 15)
  got, want = read_scalars(run), read_scalars(one["run_dir"])
  # The epochs after the resumed one, and every evaluation, as one device trained
  # them, to float32 round-off: two workers' all-reduced gradients and synchronized
  # BatchNorm sums add in another order (seen: 9e-5 relative after 15 steps, AMD Zen
  # 4). The resumed epoch's train figures are approximate under multi_worker: each
  # worker takes the chief's share of the running metrics.
  assert [s for s, _ in got["eval/loss"]] == [5, 10, 15]
  for tag, values in (("eval/loss", got["eval/loss"]),
                      ("train/loss", got["train/loss"][1:])):
    ref = dict(want[tag])
    assert [v for _, v in values] == pytest.approx([ref[s] for s, _ in values],
                                                   rel=1e-3), tag
