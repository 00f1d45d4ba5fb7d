"""The package's shape, read from its source with `ast`: one dispatcher (mpt/main.py),
five wings (train, sweep, diagnose, microbench, compare) over a ground floor (config,
console, errors, injection, records, machine, measure, models); the package itself
(mpt/__init__.py, the library entry `mpt.callbacks`) may import wings lazily, as main
does.

Fails on: a wing importing another wing; the ground floor importing a wing or main;
anything importing main; Keras/TF internals (a private attribute or keyword, or a
private module) used outside mpt/train/keras_fit.py; `--help` importing TensorFlow.

  python tests/test_architecture.py [PACKAGE_DIR]   # edges and longest import chain
"""

import ast
import functools
import pathlib
import subprocess
import sys

import pytest

from helpers import ROOT

PACKAGE = ROOT / "mpt"
WINGS = {"train", "sweep", "diagnose", "microbench", "compare"}
GROUND = {"config", "console", "errors", "injection", "records", "machine", "measure",
          "models", "supervisor"}
KERAS_FIT = "mpt.train.keras_fit"
# Private names that are public API by convention (documented in the standard library).
ALLOWED_PRIVATE = {("os", "_exit")}
PRIVATE_MODULES = ("tensorflow.python", "keras.src", "tf_keras")


def _modules(package: pathlib.Path) -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted(package.rglob("*.py")):
    parts = ("mpt",) + path.relative_to(package).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _imports(tree: ast.Module, modules: dict[str, pathlib.Path]):
  """(module imported, lazy) for each mpt import; lazy = inside a function."""
  found = []

  def visit(node, lazy):
    for child in ast.iter_child_nodes(node):
      inner = lazy or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
      names = []
      if isinstance(child, ast.Import):
        names = [a.name for a in child.names]
      elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
        names = [f"{child.module}.{a.name}" if f"{child.module}.{a.name}" in modules
                 else child.module for a in child.names]
      for name in names:
        while name and name not in modules:
          name = name.rpartition(".")[0]
        if name.startswith("mpt"):
          found.append((name, lazy))
      visit(child, inner)

  visit(tree, False)
  return found


@functools.lru_cache(maxsize=None)
def graph(package: pathlib.Path = PACKAGE):
  """{module: {imported module: lazy}} over the package's own modules."""
  modules = _modules(package)
  edges = {}
  for name, path in modules.items():
    tree = ast.parse(path.read_text(), str(path))
    mine = {}
    for target, lazy in _imports(tree, modules):
      if target != name and not (name.startswith(target + ".")):  # Not its own package.
        mine[target] = mine.get(target, True) and lazy
    edges[name] = mine
  return edges


def longest_chain(edges, lazy: bool) -> list[str]:
  @functools.lru_cache(maxsize=None)
  def chain(node, seen=frozenset()):
    best = [node]
    for target, is_lazy in edges.get(node, {}).items():
      if (lazy or not is_lazy) and target not in seen:
        path = [node] + chain(target, seen | {node})
        best = max(best, path, key=len)
    return best
  return max((chain(n) for n in edges), key=len)


def _part(module: str) -> str:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "mpt"


def test_no_wing_imports_another_wing_and_nothing_imports_upward():
  wrong = []
  for source, targets in graph().items():
    for target in targets:
      a, b = _part(source), _part(target)
      if b == "main":
        wrong.append(f"{source} -> {target} (nothing imports the dispatcher)")
      elif a in WINGS and b in WINGS and a != b:
        wrong.append(f"{source} -> {target} (wing to wing)")
      elif a in GROUND and b in WINGS:
        wrong.append(f"{source} -> {target} (ground floor to a wing)")
  assert not wrong, "\n".join(wrong)


def test_every_module_is_main_a_wing_or_ground_floor():
  parts = {_part(m) for m in graph()}
  assert parts <= WINGS | GROUND | {"main", "mpt"}, parts - WINGS - GROUND


def _private_uses(path: pathlib.Path) -> list[str]:
  tree = ast.parse(path.read_text(), str(path))
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
        not node.attr.startswith("__"):
      owner = node.value.id if isinstance(node.value, ast.Name) else None
      if owner not in ("self", "cls") and (owner, node.attr) not in ALLOWED_PRIVATE:
        found.append(f"{path.name}:{node.lineno} .{node.attr}")
    elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("_"):
      found.append(f"{path.name}:{node.value.lineno} {node.arg}=")
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [node.module or ""]
      found += [f"{path.name}:{node.lineno} import {n}" for n in names
                if n.startswith(PRIVATE_MODULES)]
  return found


def test_keras_and_tf_internals_live_only_in_keras_fit():
  modules = _modules(PACKAGE)
  outside = [use for name, path in modules.items() if name != KERAS_FIT
             for use in _private_uses(path)]
  assert not outside, "private Keras/TF use outside train/keras_fit.py:\n" + \
      "\n".join(outside)
  assert _private_uses(modules[KERAS_FIT]), "keras_fit.py should hold them"


def test_the_private_use_check_sees_attributes_keywords_and_modules(tmp_path):
  probe = tmp_path / "probe.py"
  probe.write_text("import os\nfrom tensorflow.python.framework import ops\n"
                   "m._maybe_symbolic_build = 1\nself._ok = 2\nos._exit(0)\n"
                   "t = Trace('x', _r=1)\n")
  assert [u.split(" ", 1)[1] for u in _private_uses(probe)] == [
      "import tensorflow.python.framework", "._maybe_symbolic_build", "_r="]


@pytest.mark.parametrize("argv", [["--help"], ["--helpfull"], ["--batch_size=0x"]])
def test_help_and_flag_errors_import_no_tensorflow(argv):
  probe = ("import runpy, sys\nsys.argv = ['mpt'] + sys.argv[1:]\n"
           "try:\n  runpy.run_module('mpt.main', run_name='__main__')\n"
           "except SystemExit:\n  pass\n"
           "print('IMPORTED', sorted(m for m in ('tensorflow', 'keras') "
           "if m in sys.modules))")
  proc = subprocess.run([sys.executable, "-c", probe, *argv], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert "IMPORTED []" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_graph_walk_finds_known_edges():
  edges = graph()
  assert "mpt.train.keras_fit" in edges["mpt.train.loops"]
  assert edges["mpt.main"]["mpt.train.run"] is True  # Lazy: imported when it runs.
  assert edges["mpt.main"]["mpt.config"] is False


def report(package: pathlib.Path) -> str:
  edges = graph(package)
  eager = sum(not lazy for targets in edges.values() for lazy in targets.values())
  total = sum(len(t) for t in edges.values())
  lines = [f"{package}: {len(edges)} modules, {total} import edges "
           f"({total - eager} lazy)"]
  for lazy in (False, True):
    chain = longest_chain(edges, lazy)
    lines.append(f"longest chain{' with lazy imports' if lazy else ''}: {len(chain)} "
                 f"modules: {' -> '.join(chain)}")
  return "\n".join(lines)


if __name__ == "__main__":
  print(report(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE))
