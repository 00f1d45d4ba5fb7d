"""The package's shape, read from its source with `ast`: one dispatcher (mpt/main.py),
five wings (train, sweep, diagnose, microbench, compare) over a ground floor; the
package itself (mpt/__init__.py, the library entries `mpt.callbacks` and `mpt.track`)
may import wings lazily, as main does, and mpt/__main__.py (`python -m mpt`) runs main.

The ground floor in floors, bottom up (GROUND_FLOORS); a module imports from its own
floor or below, never above, and no two packages import each other:

  1  errors, files, flagvalues, console, speech, modelnames
                                         (import nothing of mpt but errors)
  2  config                               (a run's flags, the policy table)
  3  models, records                      (model builders; the typed files)
  4  measure, machine                     (what a step costs; what the machine is)
  5  supervisor                           (child processes, OOM kills)
  6  injection                            (fault injection, for tests)

The train wing is four rooms (TRAIN_ROOMS), each importing only rooms on a lower
floor: common (what every run is made of), before_step1 (measure, then choose), then
cli (the command line's run) and script (a user's own program), which never import
each other, so that `mpt.callbacks` loads none of the command line's machinery.

Fails on: a wing importing another wing; a train room importing a room not below it; the ground floor importing a wing or main, or
a floor above its own; two packages importing each other; anything importing main; a
third-party internal (a private attribute or keyword, a module path with a `_`
component, TF/Keras/xprof modules listed in PRIVATE_MODULES, `compat.v1`) used outside
the one module INTERNALS names for it, or an internal there no longer is; a function
over 60 lines, a module over 300 lines of code, a parameter list over 8 (self/cls
not counted); `--help` importing TensorFlow; a copy of a rule that has one owner
(OWNED): a ratio formatted outside mpt/records/cost.py's `times`, a test `in SIXTEEN`,
a literal list of policy names or a module-level copy of config's tables outside
mpt/config.py, a `*MARGIN` set outside mpt/records/cost.py and
mpt/diagnose/thresholds.py. A module's size counts its code only:
blank lines, comments and docstrings are free, so that no module meets its cap by
deleting the reasons it gives (the cap on all lines did: comments were cut to fit).

  python tests/test_architecture.py [PACKAGE_DIR]   # edges, chains, floors, sizes, copies
"""

import ast
import functools
import importlib
import pathlib
import re
import subprocess
import sys

import pytest

from helpers import ROOT

PACKAGE = ROOT / "mpt"
WINGS = {"train", "sweep", "diagnose", "microbench", "compare"}
GROUND_FLOORS = (("errors", "files", "flagvalues", "console", "speech", "modelnames"),
                 ("config",),
                 ("models", "records"), ("measure", "machine"), ("supervisor",),
                 ("injection",))
GROUND = {part for floor in GROUND_FLOORS for part in floor}
KERAS_FIT = "mpt.train.common.keras_fit"
TRAIN_ROOMS = {"common": 1, "before_step1": 2, "cli": 3, "script": 3}  # Their floors.
# Private names that are public API by convention (documented in the standard library).
ALLOWED_PRIVATE = {("os", "_exit")}
# Internal modules without a `_` in their path.
PRIVATE_MODULES = ("tensorflow.python", "keras.src", "tf_keras", "xprof.convert")
# Every third-party internal mpt uses (a path prefix, or a private attribute/keyword of
# a Keras or TF object): (the one module allowed to use it, the versions it was
# written for, the name that must still exist in the installed ones or None).
INTERNALS = {
    "private attribute": (KERAS_FIT, "Keras 3.15, TF 2.21", None),  # test_keras_fit.py
    "private keyword": (KERAS_FIT, "TF 2.21", None),
    "tensorflow.python": (KERAS_FIT, "TF 2.21",
                          "tensorflow.python.util._pywrap_util_port"),
    "numpy._core._multiarray_umath": ("mpt.machine.isa", "numpy 2.4",
                                      "numpy._core._multiarray_umath.__cpu_features__"),
    "numpy.core._multiarray_umath": ("mpt.machine.isa", "numpy 1.x (the fallback)",
                                     None),
    "xprof.convert": ("mpt.machine.traces", "xprof 2.24",
                      "xprof.convert.raw_to_tool_data.xspace_to_tool_data"),
    # TF 2 reads an event file record by record only through this legacy reader.
    "tf.compat.v1.train.summary_iterator": (
        "mpt.train.cli.checkpoint", "TF 2.21", "tensorflow.compat.v1.train.summary_iterator"),
    # The fused kernel's one Python entry that returns the batch statistics.
    "tf.compat.v1.nn.fused_batch_norm": (
        "mpt.models.fused_bn", "TF 2.21", "tensorflow.compat.v1.nn.fused_batch_norm"),
}
MAX_FUNCTION_LINES, MAX_MODULE_LINES, MAX_PARAMETERS = 60, 300, 8


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
      if b == "main" and a != "__main__":  # `python -m mpt` runs the dispatcher.
        wrong.append(f"{source} -> {target} (nothing imports the dispatcher)")
      elif a in WINGS and b in WINGS and a != b:
        wrong.append(f"{source} -> {target} (wing to wing)")
      elif a in GROUND and b in WINGS:
        wrong.append(f"{source} -> {target} (ground floor to a wing)")
  assert not wrong, "\n".join(wrong)


def test_every_module_is_main_a_wing_or_ground_floor():
  parts = {_part(m) for m in graph()}
  assert parts <= WINGS | GROUND | {"main", "__main__", "mpt"}, parts - WINGS - GROUND


def _internal(path: str) -> bool:
  """Whether a third-party module path (or module.name) is an internal one."""
  parts = path.split(".")
  return (path.startswith(PRIVATE_MODULES) or ".compat.v1" in f".{path}" or
          any(p.startswith("_") and not p.startswith("__") for p in parts))


def _dotted(node) -> str:
  """`tf.compat.v1.train.x` of an attribute chain ("" past a call or subscript)."""
  if isinstance(node, ast.Name):
    return node.id
  if isinstance(node, ast.Attribute):
    owner = _dotted(node.value)
    return f"{owner}.{node.attr}" if owner else ""
  return ""


def _internal_uses(path: pathlib.Path) -> list[tuple[str, str]]:
  """(what internal, where) for each third-party internal `path` uses: a private
  attribute or keyword, an import of an internal module or name, a compat.v1 chain."""
  tree = ast.parse(path.read_text(), str(path))
  inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
  found = []  # (line, what, where)
  for node in ast.walk(tree):
    line = getattr(node, "lineno", 0)  # Keywords have one too (Python >= 3.9).
    where = f"{path.name}:{line}"
    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
        not node.attr.startswith("__"):
      owner = node.value.id if isinstance(node.value, ast.Name) else None
      if owner not in ("self", "cls") and (owner, node.attr) not in ALLOWED_PRIVATE:
        found.append((line, "private attribute", f"{where} .{node.attr}"))
    elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("_"):
      found.append((line, "private keyword", f"{where} {node.arg}="))
    elif isinstance(node, (ast.Import, ast.ImportFrom)):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
          [f"{node.module}.{a.name}" for a in node.names if node.module]
      found += [(line, n, f"{where} import {n}") for n in names
                if not n.startswith("mpt.") and _internal(n)]
    elif isinstance(node, ast.Attribute) and id(node) not in inner:
      chain = _dotted(node)
      if ".compat.v1" in chain:
        found.append((line, chain, f"{where} {chain}"))
  return [(what, where) for _, what, where in sorted(found, key=lambda f: f[0])]


def _owner(what: str) -> str | None:
  """The INTERNALS entry covering `what` (the longest prefix), or None."""
  keys = [k for k in INTERNALS if what == k or what.startswith(k + ".")]
  return max(keys, key=len) if keys else None


def test_third_party_internals_live_each_in_its_one_module():
  wrong = []
  for name, path in _modules(PACKAGE).items():
    for what, where in _internal_uses(path):
      key = _owner(what)
      if key is None:
        wrong.append(f"{name}: {where}: not in INTERNALS (add it, with its one module)")
      elif INTERNALS[key][0] != name:
        wrong.append(f"{name}: {where}: belongs in {INTERNALS[key][0]} only")
  assert not wrong, "third-party internals outside their place:\n" + "\n".join(wrong)


@pytest.mark.parametrize("key", sorted(INTERNALS))
def test_each_listed_internal_is_still_used_where_listed_and_still_exists(key):
  owner, _, name = INTERNALS[key]
  uses = {_owner(what) for what, _ in _internal_uses(_modules(PACKAGE)[owner])}
  assert key in uses, f"{owner} no longer uses {key}: drop it from INTERNALS"
  if name is not None:
    assert _exists(name), f"{name} ({INTERNALS[key][1]}) is gone: fix {owner}"


def _exists(name: str) -> bool:
  """Whether the dotted `name` resolves, importing the modules on its way."""
  parts = name.split(".")
  try:
    found = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 2):
      found = (getattr(found, part) if hasattr(found, part) else
               importlib.import_module(".".join(parts[:i])))
  except ImportError:
    return False
  return True


def test_the_internals_check_sees_attributes_keywords_modules_and_compat(tmp_path):
  probe = tmp_path / "probe.py"
  probe.write_text(
      "import os\nfrom tensorflow.python.framework import ops\n"
      "m._maybe_symbolic_build = 1\nself._ok = 2\nos._exit(0)\n"
      "t = Trace('x', _r=1)\nfrom numpy._core._multiarray_umath import f\n"
      "from xprof.convert import raw_to_tool_data\nimport numpy.linalg\n"
      "for e in tf.compat.v1.train.summary_iterator(p): pass\n"
      "from mpt.machine import _x\nfrom typing import __all__\n")
  assert [what for what, _ in _internal_uses(probe)] == [
      "tensorflow.python.framework.ops", "private attribute", "private keyword",
      "numpy._core._multiarray_umath.f", "xprof.convert.raw_to_tool_data",
      "tf.compat.v1.train.summary_iterator"]
  assert _owner("xprof.convert.raw_to_tool_data") == "xprof.convert"
  assert _owner("tf.compat.v1.nn.conv2d") is None


def _floor_faults(edges) -> list[str]:
  """Ground-floor imports that go up a floor (GROUND_FLOORS)."""
  floor = {part: i for i, parts in enumerate(GROUND_FLOORS, 1) for part in parts}
  return [f"{source} -> {target} (floor {floor[_part(source)]} to "
          f"{floor[_part(target)]})"
          for source, targets in edges.items() for target in targets
          if _part(source) in floor and _part(target) in floor
          and floor[_part(target)] > floor[_part(source)]]


def test_the_ground_floor_never_imports_a_floor_above_its_own():
  assert not _floor_faults(graph()), "\n".join(_floor_faults(graph()))


def test_no_two_packages_import_each_other():
  assert not upward_edges(graph()), upward_edges(graph())


def _room(module: str) -> str | None:
  parts = module.split(".")
  return parts[2] if len(parts) > 2 and parts[1] == "train" else None


def room_faults(edges) -> list[str]:
  """Imports between the train wing's rooms that do not go down a floor."""
  return [f"{source} -> {target} ({_room(source)} to {_room(target)})"
          for source, targets in edges.items() for target in targets
          if _room(source) and _room(target) and _room(source) != _room(target)
          and TRAIN_ROOMS.get(_room(target), 9) >= TRAIN_ROOMS.get(_room(source), 0)]


def test_every_train_module_lives_in_a_room_and_imports_only_rooms_below():
  edges = graph()
  homeless = [m for m in edges if m.startswith("mpt.train.")
              and _room(m) not in TRAIN_ROOMS]
  assert not homeless, f"train modules outside a room {sorted(TRAIN_ROOMS)}: {homeless}"
  assert not room_faults(edges), "\n".join(room_faults(edges))


def test_the_room_check_sees_an_upward_import_and_the_two_top_rooms(tmp_path):
  for room in TRAIN_ROOMS:
    (tmp_path / "train" / room).mkdir(parents=True)
  (tmp_path / "train" / "common" / "steps.py").write_text(
      "from mpt.train.before_step1 import cost\n")
  (tmp_path / "train" / "before_step1" / "cost.py").write_text(
      "from mpt.train.common import steps\n")
  (tmp_path / "train" / "script" / "library.py").write_text(
      "from mpt.train.cli import record\nfrom mpt.train.common import steps\n")
  (tmp_path / "train" / "cli" / "record.py").write_text("")
  assert room_faults(graph(tmp_path)) == [
      "mpt.train.common.steps -> mpt.train.before_step1.cost (common to before_step1)",
      "mpt.train.script.library -> mpt.train.cli.record (script to cli)"]


def test_the_floor_checks_see_an_upward_import_and_a_circle(tmp_path):
  (tmp_path / "machine").mkdir()
  (tmp_path / "records").mkdir()
  (tmp_path / "errors.py").write_text("from mpt import config\n")
  (tmp_path / "config.py").write_text("from mpt import errors\n")
  (tmp_path / "machine" / "isa.py").write_text("from mpt.records import rundir\n")
  (tmp_path / "records" / "rundir.py").write_text("from mpt.machine import isa\n")
  edges = graph(tmp_path)
  assert _floor_faults(edges) == ["mpt.errors -> mpt.config (floor 1 to 2)",
                                  "mpt.records.rundir -> mpt.machine.isa (floor 3 to 4)"]
  assert len(upward_edges(edges)) == 2  # errors <-> config, machine <-> records.


def code_lines(text: str, tree: ast.Module) -> int:
  """Lines holding code: not blank, not only a comment, not in a docstring."""
  docs = set()
  for node in ast.walk(tree):
    body = getattr(node, "body", None)
    if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
        isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
      docs.update(range(body[0].lineno, body[0].end_lineno + 1))
  return sum(1 for i, line in enumerate(text.splitlines(), 1)
             if line.strip() and not line.strip().startswith("#") and i not in docs)


def _sizes(package: pathlib.Path) -> dict[str, list[str]]:
  """What is over the limits: modules (lines of code), functions, parameter lists."""
  over = {"modules": [], "functions": [], "parameters": []}
  for path in sorted(package.rglob("*.py")):
    text, where = path.read_text(), path.relative_to(package.parent)
    tree = ast.parse(text, str(path))
    if code_lines(text, tree) > MAX_MODULE_LINES:
      over["modules"].append(f"{where}: {code_lines(text, tree)} lines of code")
    for node in ast.walk(tree):
      if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        continue
      length, a = node.end_lineno - node.lineno + 1, node.args
      params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
      params = [p for p in params if p is not None]
      if params and params[0].arg in ("self", "cls"):
        params = params[1:]
      if length > MAX_FUNCTION_LINES:
        over["functions"].append(f"{where}:{node.lineno} {node.name}: {length} lines")
      if len(params) > MAX_PARAMETERS:
        over["parameters"].append(f"{where}:{node.lineno} {node.name}: "
                                  f"{len(params)} parameters")
  return over


@pytest.mark.parametrize("kind,limit", [
    ("functions", f"{MAX_FUNCTION_LINES} lines"),
    ("modules", f"{MAX_MODULE_LINES} lines of code"),
    ("parameters", f"{MAX_PARAMETERS}")])
def test_no_function_module_or_parameter_list_over_its_limit(kind, limit):
  over = _sizes(PACKAGE)[kind]
  assert not over, f"{kind} over {limit}:\n" + "\n".join(over)


def test_the_size_checks_count_lines_and_parameters(tmp_path):
  body = lambda n: "".join(f"  x{i} = {i}\n" for i in range(n))
  text = (f"def long():\n{body(60)}\ndef just_short():\n{body(59)}\n"
          "class C:\n  def m(self, a, b, c, d, e, f, g, h):\n    pass\n"
          "def wide(a, b, c, d, e, f, g, *h, i):\n  pass\n")
  text = '"""A docstring\nof two lines."""\n# A comment.\n\n' + text  # Not code.
  text += "x = 0\n" * (MAX_MODULE_LINES + 1 - code_lines(text, ast.parse(text)))
  assert len(text.splitlines()) > MAX_MODULE_LINES + 5  # Blanks, comments, docstring.
  (tmp_path / "probe.py").write_text(text)
  wide = text.splitlines().index("def wide(a, b, c, d, e, f, g, *h, i):") + 1
  assert _sizes(tmp_path) == {
      "modules": [f"{tmp_path.name}/probe.py: 301 lines of code"],
      "functions": [f"{tmp_path.name}/probe.py:5 long: 61 lines"],
      "parameters": [f"{tmp_path.name}/probe.py:{wide} wide: 9 parameters"]}
  (tmp_path / "probe.py").write_text(text[:-len("x = 0\n")])  # 300 lines: not over.
  assert _sizes(tmp_path)["modules"] == []


# Rules with one owner each (issue 66): a copy elsewhere drifts from the owner.
# {what: (the modules that may state it, the owner a copy should call instead)}.
OWNED = {
    "ratio": (("mpt.records.cost",), "mpt/records/cost.py times()"),
    "policies": (("mpt.config",), "mpt/config.py POLICY_DTYPE, SIXTEEN, sixteen_bit()"),
    "margin": (("mpt.records.cost", "mpt.diagnose.thresholds"),
               "mpt/records/cost.py, or mpt/diagnose/thresholds.py for the diagnosis"),
    # A run's flag strings are parsed once, into its Plan; a record's recorded flags
    # (summary.json, a capture's run) are read back by the records that hold them.
    "flags": (("mpt.config", "mpt.train.common.plan", "mpt.records.summary",
               "mpt.diagnose.gpu_evidence"), "mpt/train/common/plan.py Plan"),
}
FLAG_PARSERS = {"layer_policies", "parse_opts", "parse_steps"}
POLICY_NAMES = {"float32", "mixed_bfloat16", "mixed_float16"}
CONFIG_TABLES = {"POLICY_DTYPE", "SIXTEEN", "POLICIES"}  # mpt/config.py's.
COPIERS = {"tuple", "list", "set", "frozenset", "sorted"}
RATIO_TEXT = re.compile(r"\{[^{}]*:[^{}]*[fg]\}x|%[-+ #0-9.,]*[fg]x")


def _ratio_formats(tree: ast.Module) -> list[ast.AST]:
  """f-strings (and format strings) that print a ratio themselves: `{r:.2f}x`."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.JoinedStr):
      for part, after in zip(node.values, node.values[1:]):
        spec = getattr(part, "format_spec", None)
        text = spec.values[-1] if spec and spec.values else None
        if isinstance(text, ast.Constant) and str(text.value).endswith(("f", "g")) \
            and isinstance(after, ast.Constant) and str(after.value).startswith("x"):
          found.append(part)
    elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
        RATIO_TEXT.search(node.value):
      found.append(node)
  return found


def _table(node) -> str | None:
  """The config table `node` names (`SIXTEEN`, `config.SIXTEEN`), or None."""
  name = node.id if isinstance(node, ast.Name) else \
      node.attr if isinstance(node, ast.Attribute) else None
  return name if name in CONFIG_TABLES else None


def _copied_table(node) -> str | None:
  """The config table a module-level value copies: the table itself, `tuple(T)`,
  `sorted(p for p in T ...)`; not a figure derived from it (`set(T.values())`)."""
  while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
      node.func.id in COPIERS and node.args:
    node = node.args[0]
  if isinstance(node, (ast.GeneratorExp, ast.ListComp, ast.SetComp)):
    node = node.generators[0].iter
  return _table(node)


def _policy_copies(tree: ast.Module) -> list[tuple[ast.AST, str]]:
  """Tests `in SIXTEEN` (config.sixteen_bit is the one answer), literal collections
  of two or more policy names, and module-level aliases of config's tables."""
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare) and any(
        isinstance(op, (ast.In, ast.NotIn)) and _table(c) == "SIXTEEN"
        for op, c in zip(node.ops, node.comparators)):
      found.append((node, "`in SIXTEEN`"))
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else \
        node.keys if isinstance(node, ast.Dict) else []
    names = [i.value for i in items if isinstance(i, ast.Constant)
             and i.value in POLICY_NAMES]
    if len(names) >= 2:
      found.append((node, f"policy names listed ({', '.join(names)})"))
  for node in tree.body:
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and \
        _copied_table(node.value):
      found.append((node, f"a copy of config.{_copied_table(node.value)}"))
  return found


def _margins(tree: ast.Module) -> list[tuple[ast.AST, str]]:
  """Module-level names ending in MARGIN: a cut-off, kept with its kind."""
  found = []
  for node in tree.body:
    targets = node.targets if isinstance(node, ast.Assign) else \
        [node.target] if isinstance(node, ast.AnnAssign) else []
    found += [(node, f"{t.id} set") for t in targets
              if isinstance(t, ast.Name) and t.id.endswith("MARGIN")]
  return found


def _flag_parses(tree: ast.Module) -> list[tuple[ast.AST, str]]:
  """Calls that parse a run's flag string (FLAG_PARSERS)."""
  return [(node, f"a flag parsed again ({name})") for node in ast.walk(tree)
          if isinstance(node, ast.Call) and (name := getattr(
              node.func, "attr", getattr(node.func, "id", None))) in FLAG_PARSERS]


def owned_copies(package: pathlib.Path) -> list[tuple[str, int, str, str]]:
  """(file, line, what, its owner) for each copy of an OWNED rule outside its owner."""
  out = []
  for name, path in _modules(package).items():
    tree = ast.parse(path.read_text(), str(path))
    found = {"ratio": [(n, "a ratio formatted here") for n in _ratio_formats(tree)],
             "policies": _policy_copies(tree), "margin": _margins(tree),
             "flags": _flag_parses(tree)}
    for kind, hits in found.items():
      owners, owner = OWNED[kind]
      out += [(str(path.relative_to(package.parent)), node.lineno, what, owner)
              for node, what in hits if name not in owners]
  return sorted(out, key=lambda c: c[:2])


def test_no_copy_of_an_owned_rule():
  copies = [f"{f}:{line}: {what} (use {owner})" for f, line, what, owner in
            owned_copies(PACKAGE)]
  assert not copies, "copies of a rule that has one owner:\n" + "\n".join(copies)


def test_the_owner_check_sees_each_kind_of_copy(tmp_path):
  (tmp_path / "records").mkdir()
  (tmp_path / "config.py").write_text(
      'POLICY_DTYPE = {"float32": "float32", "mixed_float16": "float16"}\n'
      'SIXTEEN = {p: d for p, d in POLICY_DTYPE.items() if d != "float32"}\n'
      'def sixteen_bit(p):\n  return p if p in SIXTEEN else None\n')
  (tmp_path / "records" / "cost.py").write_text(
      'ONEDNN_MARGIN = 0.05\ndef times(r):\n  return f"{r:.3g}x"\n')
  (tmp_path / "probe.py").write_text(
      'from mpt import config\nfrom mpt.config import SIXTEEN\n'
      'a = f"{r:.2f}x faster"\n'                       # 3: a ratio
      'b = f"at most {1 / s:.1f}x" + "%.0fx" % r\n'    # 4: two
      'c = policy in config.SIXTEEN or p not in SIXTEEN\n'  # 5: two
      'for p in ("float32", "mixed_float16"): pass\n'  # 6: names listed
      'd = {"float32": 1, "mixed_bfloat16": 2}\n'      # 7: names listed
      'POLICIES = tuple(config.POLICY_DTYPE)\n'        # 8: a copy
      'HALF = SIXTEEN\n'                               # 9: a copy
      'ALL = sorted(p for p in config.POLICIES if p != "auto")\n'  # 10: a copy
      'PLAN_MARGIN = 0.05\n'                           # 11: a margin
      'pairs = config.layer_policies(cfg.layer_policy)\n'  # 12: a flag parsed
      # Not copies: the owners used, one name, other formats, derived figures.
      'e = config.sixteen_bit(p) or policy == "float32" or config.SIXTEEN.get(p)\n'
      'f = f"{ms:.1f} ms, {share:.0%}, {n}x, {r:.2f} x"\n'
      'DTYPES = set(config.SIXTEEN.values())\n'
      'g = ("float32", "bfloat16", "float16")\n'
      'def h():\n  MARGIN = 0.1\n  return MARGIN\n')
  assert [(line, what) for _, line, what, _ in owned_copies(tmp_path)] == [
      (3, "a ratio formatted here"), (4, "a ratio formatted here"),
      (4, "a ratio formatted here"), (5, "`in SIXTEEN`"), (5, "`in SIXTEEN`"),
      (6, "policy names listed (float32, mixed_float16)"),
      (7, "policy names listed (float32, mixed_bfloat16)"),
      (8, "a copy of config.POLICY_DTYPE"), (9, "a copy of config.SIXTEEN"),
      (10, "a copy of config.POLICIES"), (11, "PLAN_MARGIN set"),
      (12, "a flag parsed again (layer_policies)")]


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
  assert "mpt.train.common.keras_fit" in edges["mpt.train.cli.loops"]
  assert edges["mpt.main"]["mpt.train.cli.run"] is True  # Lazy: imported when it runs.
  assert edges["mpt.main"]["mpt.config"] is False


def package_edges(edges) -> dict[str, set[str]]:
  """{package: {package it imports}} at the top level (train, records, config, ...)."""
  out = {}
  for source, targets in edges.items():
    mine = out.setdefault(_part(source), set())
    mine.update(_part(t) for t in targets if _part(t) != _part(source))
  return out


def package_floors(edges) -> dict[str, int]:
  """{package: floor}: 1 + the highest floor it imports, 1 for importing nothing.

  An import that closes a circle is not followed (it is then reported as upward).
  """
  packages = package_edges(edges)
  floors = {}

  def floor(name, path):
    if name not in floors:
      below = [floor(t, path | {name}) for t in sorted(packages.get(name, ()))
               if t not in path | {name}]
      floors[name] = 1 + max(below, default=0)
    return floors[name]

  for name in sorted(packages):
    floor(name, frozenset())
  return floors


def upward_edges(edges) -> list[str]:
  """Package imports whose target is not on a lower floor than their source."""
  floors = package_floors(edges)
  return [f"{a} -> {b}" for a, targets in sorted(package_edges(edges).items())
          for b in sorted(targets) if floors[b] >= floors[a]]


def _package_lines(package: pathlib.Path, part=_part) -> dict[str, int]:
  """{part: its modules' lines} (all lines; `part(module)` None: not counted)."""
  lines = {}
  for name, path in _modules(package).items():
    if part(name) is not None:
      lines[part(name)] = lines.get(part(name), 0) + len(path.read_text().splitlines())
  return lines


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
  sizes = _package_lines(package)
  lines.append(f"lines per package ({sum(sizes.values())} in all): " + ", ".join(
      f"{name} {n}" for name, n in sorted(sizes.items(), key=lambda i: (-i[1], i[0]))))
  rooms = _package_lines(package, _room)
  lines.append("lines per train room: " + (", ".join(
      f"{name} {n}" for name, n in sorted(rooms.items(), key=lambda i: (-i[1], i[0])))
      or "none"))
  lines.append(f"train room imports not going down ({len(room_faults(edges))}): "
               + ("; ".join(room_faults(edges)) or "none"))
  floors = package_floors(edges)
  lines.append("package floors, top down:")
  for level in sorted(set(floors.values()), reverse=True):
    lines.append(f"  {level}: " + ", ".join(sorted(p for p in floors
                                                   if floors[p] == level)))
  packages = package_edges(edges)
  lines.append(f"package edges ({sum(map(len, packages.values()))}):")
  lines += [f"  {a} -> {', '.join(sorted(t))}" for a, t in sorted(packages.items())
            if t]
  upward = upward_edges(edges)
  lines.append(f"upward package edges ({len(upward)}): {', '.join(upward) or 'none'}")
  limits = {"modules": MAX_MODULE_LINES, "functions": MAX_FUNCTION_LINES,
            "parameters": MAX_PARAMETERS}
  for kind, over in _sizes(package).items():
    lines.append(f"{kind} over {limits[kind]} ({len(over)}): {'; '.join(over) or 'none'}")
  copies = [f"{f}:{line} {what}" for f, line, what, _ in owned_copies(package)]
  lines.append(f"copies of owned rules ({len(copies)}): {'; '.join(copies) or 'none'}")
  return "\n".join(lines)


if __name__ == "__main__":
  print(report(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE))
