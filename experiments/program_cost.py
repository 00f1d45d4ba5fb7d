"""Each program's step timed per policy before its steps against what its runs then
measure: every program of the test corpus (tests/train/script/programs) and the
programs of experiments/programs (a distiller with a frozen teacher in its loss, a
classifier on a frozen encoder after the same classifier trained whole, a custom Loss
subclass, several models fitted in one process), each run under float32 and under
mixed_bfloat16 (the program's own set_global_policy answered with the policy run),
each run its own child process with an empty cache and MPT_COST=always (measured
whatever the run's length: the corpus' runs are too short to pay for it).

Per fit it prints: the run's own policy's figure as timed before step 1 beside the
ms/step that run measured; the mixed_bfloat16 / float32 ratio the float32 run timed
(a figure, or a bound where timing stopped) beside the ratio of the two runs; and
each run's first finding, with what it advised.

  python experiments/program_cost.py [--programs=corpus,new | NAME,...] [--repeats=N]
                                     [--scale=8] [--out=DIR]

With repeats, each figure is the median over the runs (the policies interleaved).
"""

import argparse
import importlib.util
import json
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "train" / "script" / "programs"
NEW = ROOT / "experiments" / "programs"
NEW_PROGRAMS = ("distillation", "frozen_encoder", "custom_loss", "trials")
POLICIES = ("float32", "mixed_bfloat16")


def _module(folder: pathlib.Path, name: str):
  spec = importlib.util.spec_from_file_location(f"program_{name}", folder / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def child(name: str, policy: str, out: str, scale: str = "1") -> None:
  """Runs program `name` with every set_global_policy answered with `policy`, its
  steps per epoch (or steps) times `scale`."""
  os.environ.setdefault("KERAS_BACKEND", "tensorflow")
  import keras  # pylint: disable=import-outside-toplevel
  real = keras.mixed_precision.set_global_policy
  real(policy)
  forced = keras.mixed_precision.global_policy()  # One object, as a program has.
  keras.mixed_precision.set_global_policy = lambda _: real(forced)
  keras.config.set_dtype_policy = keras.mixed_precision.set_global_policy
  keras.utils.set_random_seed(0)
  folder = NEW if name in NEW_PROGRAMS else CORPUS
  module = _module(folder, name)
  for constant in ("STEPS_PER_EPOCH", "STEPS"):  # Its data follows: batch x steps.
    if hasattr(module, constant):
      setattr(module, constant, getattr(module, constant) * int(scale))
  module.main(out)


def _advised(step: str) -> str | None:
  """The policy a next step advises switching to (a guess's "time it before
  switching" advises measuring, not switching)."""
  if (step or "").startswith("time "):
    return None
  found = re.search(r"--policy=(\w+)|set_global_policy\('(\w+)'\)", step or "")
  return (found.group(1) or found.group(2)) if found else None


def _fits(run_dir: pathlib.Path) -> list[dict]:
  """Per fit of one run folder: its own row as timed, its steps' figure, the ratio
  its cost gives, and the run's first finding."""
  s = json.loads((run_dir / "summary.json").read_text())
  diagnosis = json.loads((run_dir / "diagnosis.json").read_text()) \
      if (run_dir / "diagnosis.json").exists() else {}
  first = (diagnosis.get("findings") or [{}])[0]
  out = []
  for fit in (s.get("program") or {}).get("fits") or [{}]:
    cost = fit.get("cost") or {}
    rows = {r["policy"]: r for r in cost.get("policies", []) if not r.get("layer_policy")}
    timed = lambda p: rows[p].get("timed_ms") or rows[p].get("ms_per_step") if p in rows \
        else None
    own = rows.get(s["policy"], {})
    ratio = (timed("mixed_bfloat16") / timed("float32")
             if timed("mixed_bfloat16") and timed("float32") else None)
    out.append({"own_timed": timed(s["policy"]), "own_bound": own.get("bound"),
                "run_ms": fit.get("ms_per_step") or s.get("ms_per_step"),
                "ratio": ratio, "ratio_bound": rows.get("mixed_bfloat16", {}).get("bound"),
                "not_measured": (s.get("not_measured") or {}).get("cost"),
                "seconds": cost.get("seconds"), "source": cost.get("source"),
                "first": first.get("id", "-"), "advised": _advised(first.get("next_step")),
                "wall": s.get("wall_s")})
  return out


def run(name: str, policy: str, out: pathlib.Path, repeat: int, scale: int = 1
        ) -> dict[str, list[dict]]:
  folder = out / name / f"{policy}-{repeat}"
  env = {**os.environ, "MPT_COST": "always", "TF_CPP_MIN_LOG_LEVEL": "2",
         "MPT_CACHE": tempfile.mkdtemp(prefix="mpt-cache-")}
  done = subprocess.run([sys.executable, __file__, "--child", name, policy, str(folder),
                         str(scale if name not in NEW_PROGRAMS else 1)],
                        env=env, capture_output=True, text=True, timeout=1800, check=False)
  (out / f"{name}-{policy}-{repeat}.log").write_text(done.stdout + done.stderr)
  if done.returncode:
    print(f"{name} {policy}: exit {done.returncode}: {done.stderr[-500:]}", file=sys.stderr)
  return {str(p.parent.relative_to(folder)): _fits(p.parent)
          for p in sorted(folder.rglob("summary.json"))}


def _median(runs: list[dict]) -> dict:
  """Field by field, the median over repeated runs of a fit (its other fields: the
  first run's)."""
  found = dict(runs[0])
  for key in ("own_timed", "run_ms", "ratio", "seconds"):
    values = [r[key] for r in runs if r[key] is not None]
    found[key] = statistics.median(values) if values else None
  return found


def _row(name: str, where: str, i: int, fits: dict[str, dict]) -> str:
  """One fit's row: `fits` by policy run (float32, mixed_bfloat16, and any policy a
  first finding advised, run to check it)."""
  f32, bf16 = fits["float32"], fits["mixed_bfloat16"]
  ms = lambda p: fits[p]["run_ms"] if p in fits else None
  measured = ms("mixed_bfloat16") / ms("float32") if ms("mixed_bfloat16") and ms(
      "float32") else None
  cells = []
  for r in (f32, bf16):
    off = r["run_ms"] / r["own_timed"] if r["own_timed"] and r["run_ms"] else None
    bound = f"{r['own_bound']} " if r["own_bound"] else ""
    cells.append(f"{bound}{r['own_timed'] or 0:,.1f} vs {r['run_ms'] or 0:,.1f} "
                 f"({off or 0:.2f})" if r["own_timed"] else
                 f"- ({(r['not_measured'] or '')[:40]})")
  ratio = f32["ratio"]
  kind = f32["ratio_bound"]
  holds = ("-" if ratio is None or measured is None else
           f"{max(ratio, measured) / min(ratio, measured):.2f}" if not kind else
           "holds" if (ratio >= measured if kind == "at most" else ratio <= measured)
           else "FAILS")
  advice = []
  for policy, r in (("float32", f32), ("mixed_bfloat16", bf16)):
    advised = r["advised"]
    slower = ms(advised) / ms(policy) if advised and ms(advised) and ms(policy) else None
    advice.append(f"{r['first']}" + (f" (advises {advised}: its run {slower:.2f}x)"
                                     if slower else f" (advises {advised})" if advised
                                     else "") + (" BAD" if slower and slower >= 1.10
                                                 else ""))
  opens = "-" if not measured or measured < 1.5 else (
      "yes" if bf16["first"].startswith(("slow_kernel", "no_speedup", "hardware"))
      else "NO")
  return (f"| {name}/{where}#{i} | {cells[0]} | {cells[1]} | "
          f"{(kind + ' ') if kind else ''}{ratio or 0:.2f} | {measured or 0:.2f} | "
          f"{holds} | {f32['seconds'] or 0:.1f} | {advice[0]} | {advice[1]} | {opens} |")


def main() -> None:
  if sys.argv[1:2] == ["--child"]:
    child(*sys.argv[2:6])
    return
  parser = argparse.ArgumentParser()
  parser.add_argument("--programs", default="corpus,new")
  parser.add_argument("--out", default=tempfile.mkdtemp(prefix="program_cost-"))
  parser.add_argument("--repeats", type=int, default=1)
  # The corpus' programs run 6-16 steps: too few for a run's median to mean anything
  # (identical 8-step runs measured 4.8-15 ms/step); their steps times this.
  parser.add_argument("--scale", type=int, default=8)
  args = parser.parse_args()
  sys.path.insert(0, str(CORPUS))
  names = []
  for part in args.programs.split(","):
    names += (list(_module(CORPUS, "run_all").PROGRAMS) if part == "corpus" else
              list(NEW_PROGRAMS) if part == "new" else [part])
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  print(f"runs in {out}")
  print("| program/run#fit | float32 run: own timed vs run ms (run/timed) | "
        "mixed_bfloat16 run: own timed vs run ms | bf16/f32 timed (f32 run) | "
        "bf16/f32 runs | off by | measuring s (f32 run) | first finding f32 run | "
        "first finding bf16 run | bf16 >= 1.5x slower opens with it |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for name in names:
    runs = [{p: run(name, p, out, r, args.scale) for p in POLICIES}
            for r in range(args.repeats)]
    advised = {f["advised"] for r in runs for p in POLICIES for fits in r[p].values()
               for f in fits} - set(POLICIES) - {None}
    for policy in sorted(advised):  # A first finding's advice, checked by its run.
      for r in range(args.repeats):
        runs[r][policy] = run(name, policy, out, r, args.scale)
    for where in runs[0]["float32"]:
      by_policy = {p: list(zip(*[r[p].get(where, []) for r in runs])) for p in runs[0]}
      for i in range(len(by_policy["float32"])):
        fits = {p: _median(list(f[i])) for p, f in by_policy.items() if len(f) > i}
        if "mixed_bfloat16" in fits:
          print(_row(name, where, i, fits), flush=True)


if __name__ == "__main__":
  main()
