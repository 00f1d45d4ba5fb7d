"""The names of mpt's own models, read from the source of mpt/models/ (each
`@register` builder) without importing Keras: `--model` and a sweep's `--models` are
checked before any process starts and before TensorFlow loads. A `keras:NAME` or
`package.module:function` model is the user's, checked where it is built.
tests/models/test_models.py holds the names equal to the registry's."""

import ast
import functools
import pathlib

from mpt.errors import UserError

MODELS = pathlib.Path(__file__).parent / "models"


@functools.cache
def builtin() -> tuple[str, ...]:
  """The registered builders' names, sorted (models.names() without importing)."""
  found = []
  for path in sorted(MODELS.glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.FunctionDef) and any(
          isinstance(d, ast.Name) and d.id == "register" for d in node.decorator_list):
        found.append(node.name)
  return tuple(sorted(found))


def check(name: str) -> None:
  """UserError, naming the valid ones, for a model that is neither mpt's nor a
  user's (`keras:NAME`, `package.module:function`)."""
  if ":" not in name and name not in builtin():
    raise UserError(unknown(name, builtin()))


def unknown(name: str, names) -> str:
  return (f"unknown --model={name!r}; valid: {', '.join(names)}, keras:NAME "
          "(keras.applications) or package.module:function")
