"""The documentation against the code, without TensorFlow: the README's quick start
(CI runs its second command verbatim), the flags table of docs/usage.md against the
flags mpt defines (names and defaults), and every relative link of the Markdown pages
pointing at a file of the repository, and at a heading of it when it names one. The
table of findings in docs/diagnosis.md is checked against the detectors' thresholds in
tests/diagnose/test_diagnose.py.
"""

import re

import pytest

from helpers import ROOT

QUICK_START = ("pip install -e . && python -m mpt.main",
               "pip install -e '.[test,cluster]' && python -m pytest -q -n 3 tests")
PAGES = [ROOT / "README.md", ROOT / "BUILD.md", ROOT / "experiments" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_quick_start_is_in_the_readme_and_ci_runs_its_test_command():
  readme = (ROOT / "README.md").read_text()
  for command in QUICK_START:
    assert command in readme, command
  assert QUICK_START[1] in (ROOT / ".ci" / "run").read_text()


def flags_table() -> dict[str, str]:
  """{flag name: its cell of the default column} of docs/usage.md's table of flags."""
  text = (ROOT / "docs" / "usage.md").read_text()
  section = text.split("\n## Flags\n", 1)[1].split("\n## ", 1)[0]
  table = {}
  for line in section.splitlines():
    if not line.startswith("| `--"):
      continue
    names_cell, defaults_cell = line.split("|")[1:3]
    names = re.findall(r"`--([a-z0-9_]+)`", names_cell)
    defaults = [d.strip() for d in defaults_cell.split(",")]
    if len(defaults) != len(names):  # An empty cell: no default worth stating.
      defaults = [""] * len(names)
    for name, default in zip(names, defaults):
      assert name not in table, f"--{name} is in two rows"
      table[name] = default
  return table


def test_the_flags_table_lists_exactly_the_flags_mpt_defines():
  from mpt import main  # Defines the flags on absl's global FLAGS; no TensorFlow.
  defined = {"mode"} | {f.name for f in main.all_fields()}
  documented = set(flags_table())
  assert sorted(defined - documented) == [], "flags missing from docs/usage.md"
  assert sorted(documented - defined) == [], "docs/usage.md names flags mpt lacks"


def _states(cell: str, default) -> bool | None:
  """Whether the table's `cell` states `default`; None where it cannot say (words such
  as `whole set` or `auto`, a list abbreviated as `256..2048`)."""
  if isinstance(default, bool):
    return {"on": True, "off": False}.get(cell, None) == default if cell else None
  if isinstance(default, (int, float)):
    try:
      return float(cell) == float(default)
    except ValueError:
      return None
  if isinstance(default, str) and default and "," not in default and cell:
    return cell == default
  return None


def test_the_flags_table_states_the_defaults_the_code_has():
  from mpt import main
  wrong = [(name, cell, main.FLAGS[name].default)
           for name, cell in flags_table().items()
           if name in main.FLAGS and _states(cell, main.FLAGS[name].default) is False]
  assert wrong == []


def _anchors(path) -> set[str]:
  """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces
  as hyphens."""
  text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
  headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
  return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
          for h in headings}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_point_at_files_and_headings_of_the_repository(page):
  broken = []
  for target in LINK.findall(page.read_text()):
    if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
      continue
    file, _, anchor = target.partition("#")
    path = (page.parent / file).resolve() if file else page
    if ROOT.resolve() not in path.parents and path != ROOT.resolve():
      broken.append(f"{target}: outside the repository")
    elif not path.exists():
      broken.append(f"{target}: no such file")
    elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
      broken.append(f"{target}: no such heading")
  assert broken == []


def test_the_readme_states_the_suites_size(request):
  """The one count of the tests (README's Development section), against what this
  session collected: checked when the whole suite was asked for, as the README's
  test command asks (a subset, -k or -m collects fewer): on any other run it skips,
  so it can only fail on a whole-suite run."""
  opts = request.config.option
  asked = [ROOT / a for a in request.config.args]
  whole = [p.resolve() for p in asked] == [(ROOT / "tests").resolve()]
  if not whole or opts.keyword or opts.markexpr:
    pytest.skip("the whole suite was not collected")
  said = re.search(r"\((\d+) tests, ", (ROOT / "README.md").read_text())
  assert said and int(said.group(1)) == len(request.session.items), (
      f"README says {said and said.group(1)} tests; the suite has "
      f"{len(request.session.items)}")


def unnamed_modules(package) -> dict[str, list[str]]:
  """{package: its modules (and subpackages) its __init__'s docstring does not name}
  for every package under `package` (the top one's docstring is the library's API)."""
  import ast
  missing = {}
  for init in sorted(package.rglob("__init__.py")):
    if init.parent == package:
      continue
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    names = [p.name for p in init.parent.glob("*.py") if p.name != "__init__.py"]
    names += [f"{p.name}/" for p in init.parent.iterdir() if (p / "__init__.py").is_file()]
    if [n for n in names if n not in doc]:
      missing[str(init.parent.relative_to(package.parent))] = sorted(
          n for n in names if n not in doc)
  return missing


def test_every_rooms_docstring_names_every_module_in_it(tmp_path):
  """A room's docstring is its map: a module it does not name is a room a newcomer
  cannot find. The check, then a planted module it must see."""
  assert not unnamed_modules(ROOT / "mpt")
  (tmp_path / "mpt" / "room").mkdir(parents=True)
  (tmp_path / "mpt" / "room" / "__init__.py").write_text('"""kept.py: kept."""\n')
  for name in ("kept.py", "new.py"):
    (tmp_path / "mpt" / "room" / name).write_text("")
  assert unnamed_modules(tmp_path / "mpt") == {"mpt/room": ["new.py"]}


def test_the_usage_page_counts_the_programs_of_the_corpus():
  """docs/usage.md says how many programs tests/train/script/programs holds."""
  folder = ROOT / "tests" / "train" / "script" / "programs"
  programs = [p for p in folder.glob("*.py") if p.stem not in ("__init__", "run_all")]
  said = re.search(r"programs/` holds (\d+) short programs",
                   (ROOT / "docs" / "usage.md").read_text())
  assert said and int(said.group(1)) == len(programs)
