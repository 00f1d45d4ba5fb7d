"""TF's oneDNN rewrite for a training run: chosen before TensorFlow is imported.

TF 2.21 turns its oneDNN graph rewrite on by default only on CPUs with AVX512_VNNI,
AVX512_BF16, AVX_VNNI or AMX (mpt/machine/hardware.onednn_default); elsewhere (an
AVX2-only Zen 3) TF runs its Eigen kernels, measured 1.3x slower there in float32.
The variable TF_ENABLE_ONEDNN_OPTS decides it once per process, at TF's first op, so
the choice is made by the parent of the training run (mpt/supervisor.py), which
imports no TensorFlow: `choose(cfg)` measures this model's step (mpt/train/before_step1/cost.py)
in one child process per setting, where TF's default leaves the rewrite off and
`--onednn=auto`, and keeps the faster; `--onednn=on|off` or the variable already set
decide without measuring. The training run reads the choice back (`current`), says
it, and records it in summary.json (`onednn_choice`).
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from mpt import config
from mpt.errors import UserError
from mpt.machine import hardware
from mpt.machine import isa
from mpt.records import cost as cost_lib
from mpt.records import keyed
from mpt.records.cost import Cost, OnednnChoice

VAR = "TF_ENABLE_ONEDNN_OPTS"
CHOICE_FILE = "MPT_ONEDNN_CHOICE"  # The parent's choice, for the training child.


def _parse(value: str) -> bool | None:
  v = value.strip().lower()
  return True if v in ("1", "true") else False if v in ("0", "false") else None


def planned_steps(cfg: config.Config) -> int | None:
  """The run's train steps, where the flags alone say (None: a dataset's size)."""
  if cfg.steps_per_epoch:
    per_epoch = cfg.steps_per_epoch
  elif cfg.dataset == "synthetic":
    per_epoch = -(-cfg.synthetic_train // cfg.batch_size)
  else:
    return None
  return per_epoch * cfg.epochs


def _measure(cfg: config.Config, on: bool, policies: list[str]) -> tuple[Cost | None, str]:
  """This model's step under `policies` in a child with the rewrite `on`; (the cost,
  why there is none)."""
  folder = pathlib.Path(tempfile.mkdtemp(prefix="mpt-onednn-"))
  try:
    (folder / "flags.txt").write_text(config.to_flagfile(cfg))
    env = {**os.environ, VAR: "1" if on else "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run(
        [sys.executable, "-m", "mpt.train.before_step1.cost", str(folder / "flags.txt"),
         str(folder / "cost.json"), ",".join(policies), str(planned_steps(cfg) or "")],
        capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
      return None, (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
    found = cost_lib.read(folder / "cost.json")
    cost_lib.save(found)
    return found, ""
  except (OSError, ValueError, subprocess.TimeoutExpired) as e:
    return None, str(e)[:200]
  finally:
    shutil.rmtree(folder, ignore_errors=True)


def _cached_or_measured(cfg, on: bool, policies: list[str]) -> tuple[Cost | None, str]:
  found = cost_lib.cached(cost_lib.key_for(cfg, on, isa.detect()))
  known = found and all(found.of(p) and found.of(p).ms_per_step for p in policies)
  return (found, "") if known else _measure(cfg, on, policies)


def _gpu_visible() -> bool:
  """An NVIDIA GPU the training process would use (without importing TensorFlow)."""
  hidden = os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1")
  return not hidden and (os.path.exists("/dev/nvidia0") or bool(shutil.which("nvidia-smi")))


def _figures(cost: Cost | None, policies: list[str]) -> dict[str, float]:
  """{policy: its figure} of `policies` and float32 (a bound is not a figure)."""
  rows = [cost.of(p) for p in ["float32", *policies]] if cost else []
  return {r.policy: r.ms_per_step for r in rows if r and r.ms_per_step and not r.bound}


def _compared(on: dict[str, float], off: dict[str, float], policies: list[str]
              ) -> tuple[dict[str, float], str]:
  """({"on": ms, "off": ms}, what they are of): the fastest of the run's `policies`
  with a figure both ways, else float32's (a bound decides nothing here)."""
  both = [p for p in policies if p in on and p in off]
  if both:
    best = min(both, key=lambda p: on[p])
    return {"on": on[best], "off": off[best]}, best
  if "float32" in on and "float32" in off:
    return {"on": on["float32"], "off": off["float32"]}, "float32"
  return {}, ""


def _not_worth_measuring(cfg: config.Config) -> str | None:
  """Why measuring both settings cannot pay for this run, or None."""
  steps = planned_steps(cfg)
  if os.environ.get("MPT_COST"):
    return "MPT_COST stands in for the measurement"
  if _gpu_visible():
    return "the step runs on a GPU, where oneDNN's rewrite does not apply"
  if cfg.strategy == "multi_worker":
    return "each worker of a cluster would choose on its own"
  if steps is not None and steps < cost_lib.MIN_RUN_STEPS:
    return f"this run's {steps} steps cost about what measuring would"
  return None


def choose(cfg: config.Config, measure=_cached_or_measured) -> OnednnChoice:
  """The setting the run trains with and why; measures only where it can matter."""
  env = os.environ.get(VAR)
  default, because = hardware.onednn_default(hardware.cpu_flags())
  if cfg.onednn != "auto":
    on = cfg.onednn == "on"
    return OnednnChoice(on, "1" if on else "0", default, "--onednn",
                        f"--onednn={cfg.onednn}")
  if env is not None and _parse(env) is not None:
    return OnednnChoice(_parse(env), env, default, "environment",
                        f"{VAR}={env} was set in the environment")
  if default or default is None:
    return OnednnChoice(default, None, default, "TF's default", because)
  why = _not_worth_measuring(cfg)
  if why:
    return OnednnChoice(False, None, default, "TF's default",
                        f"{because}; not measured: {why}")
  key = {"model": cfg.model, "policy": cfg.policy,
         **cost_lib.machine_key(None, isa.detect())}
  cached = keyed.cached("onednn", key, cost_lib.read_choice)
  if cached and len(cached.measured_ms) == 2:
    cached.why += f" ({cached.source}: measured once per machine and model)"
    return cached
  run_policies = list(config.POLICY_DTYPE) if cfg.policy == "auto" else [cfg.policy]
  policies = list(dict.fromkeys(["float32", *run_policies]))
  figures, errors, took, start = {}, [], [], time.perf_counter()
  for setting in (False, True):
    # With the rewrite on (what measured faster on the CPUs met so far) every policy:
    # when it wins, the run finds its whole cost cached and measures nothing more.
    begin = time.perf_counter()
    found, error = measure(cfg, setting,
                           list(config.POLICY_DTYPE) if setting else policies)
    took.append(f"{'on' if setting else 'off'} {time.perf_counter() - begin:.1f} s")
    figures[setting] = _figures(found, run_policies)
    if not figures[setting]:
      errors.append(f"{'on' if setting else 'off'}: {error or 'nothing measured'}")
  seconds = round(time.perf_counter() - start, 1)
  took = ", ".join(took)  # Each child's, its TensorFlow import included.
  ms, what = _compared(figures[True], figures[False], run_policies)
  if not ms:
    return OnednnChoice(False, None, default, "TF's default",
                        f"{because}; measuring failed ({'; '.join(errors)})", ms, seconds)
  faster = ms["on"] < ms["off"] * (1 - cost_lib.ONEDNN_MARGIN)
  measured = (f"this model's {what} step measured ~{ms['on']:.0f} ms with it, "
              f"~{ms['off']:.0f} without ({cost_lib.times(max(ms.values()) / min(ms.values()))}; "
              f"measured in {seconds:g} s: {took})")
  found = (OnednnChoice(True, "1", default, "measured",
                        f"{measured}; {because}, so mpt sets {VAR}=1", ms, seconds)
           if faster else OnednnChoice(False, None, default, "measured",
                                       f"{measured}; TF's default (off) kept", ms, seconds))
  found.key = key
  keyed.save("onednn", found)
  return found


def for_child(cfg: config.Config) -> dict[str, str]:
  """The environment the training child needs: the variable (when it must be set)
  and the choice's file. Prints the choice when mpt measured or was told. A resumed
  run keeps the setting its flags.txt records."""
  if cfg.resume:
    try:
      saved = pathlib.Path(cfg.resume).expanduser() / "flags.txt"
      cfg = config.from_flagfile(saved.read_text())
    except (OSError, UserError):
      pass  # The training child says what is wrong with the folder.
  choice = choose(cfg)
  handle, path = tempfile.mkstemp(prefix="mpt-onednn-choice-", suffix=".json")
  os.close(handle)
  cost_lib.write(pathlib.Path(path), choice)
  if choice.chosen_by in ("measured", "--onednn"):
    print(f"mpt: oneDNN's rewrite {choice.label()}: {choice.why}", flush=True)
  env = {CHOICE_FILE: path}
  if choice.env is not None:
    env[VAR] = choice.env
  return env


def forget(child_env: dict[str, str]) -> None:
  """Removes the choice's file once the training child has ended."""
  if child_env.get(CHOICE_FILE):
    pathlib.Path(child_env[CHOICE_FILE]).unlink(missing_ok=True)


def current(rewrite_on: bool) -> OnednnChoice:
  """In the training process: the parent's choice, with the rewrite's state TF
  reports here (`rewrite_on`), or, unsupervised, what the environment made of it."""
  path = os.environ.get(CHOICE_FILE)
  env = os.environ.get(VAR)
  try:
    choice = cost_lib.read_choice(pathlib.Path(path)) if path else None
  except (OSError, ValueError, TypeError):
    choice = None
  if choice is None:
    default, because = hardware.onednn_default(hardware.cpu_flags())
    choice = (OnednnChoice(rewrite_on, env, default, "environment", f"{VAR}={env}")
              if env is not None else
              OnednnChoice(rewrite_on, None, default, "TF's default", because))
  if choice.on != rewrite_on:  # A TF built without oneDNN, say: TF's answer holds.
    choice.why += f" (TF reports the rewrite {'on' if rewrite_on else 'off'})"
    choice.on = rewrite_on
  choice.env = env
  return choice
