"""A static parameter walk: how far one value travels through the package.

  python experiments/walk.py ROOT MODULE:FUNCTION:PARAM [--trace] [--callbacks]

ROOT is a checkout's root (the package: ROOT/mpt); FUNCTION is `f` or `Class.m`.
Pure `ast`: nothing is imported or run. Prints `stays S, files F, climbs C (up U,
back B), returns R, unresolved N`; --trace lists the stays in order (callee
file:line name [argument->parameter] from the call site; ^ up, < back, @ on the
call stack already, so not re-entered).

The walk reads FUNCTION's body in source order (inner calls first) with PARAM
tracked, and, one level deep, each local bound (`=`, `+=`, `:=`, `for`, `with`,
comprehensions) from an expression containing a tracked parameter (`plan =
resolve(cfg)`). A call *passes* the value when an argument (positional, keyword,
`*x`, `**x`) is a tracked name or an attribute chain of one (`cfg.policy`).
- stay: a call passing the value to a function of the package, resolved through
  the module's imports (`from mpt.x import y [as z]`, `import mpt.x [as z]`,
  relative ones, `__init__` re-exports), its own functions and classes,
  `self.m`/`cls.m` in the enclosing class or a package base, and `C(...)` (a stay
  in `C.__init__`; none if C has none, as a dataclass). On a tracked `self`,
  `self.m(...)` is a stay with m's `self` tracked. The walk recurses with the
  receiving parameters tracked: positions in order (`self`/`cls` skipped), a value
  past them or under an unknown keyword to `*args`/`**kwargs` (none: it stops),
  `**x` to the first parameter not bound by position. A (function, parameters)
  pair already on the call stack is a stay not re-entered; entering a function
  again from elsewhere is another stay. At most 500 stays. --callbacks: `self.m`
  passed uncalled (`attempt("x", self._x)`) on a tracked `self` is a stay in m.
- files: the distinct source files among the start and the stays.
- climbs: stays going *up* (the callee's folder a proper ancestor of the caller's:
  mpt/train/cli/x.py -> mpt/config.py) or coming *back* (into a file the walk was
  in and left: A -> B -> A counts the second A); a stay can be both.
- returns: stays whose callee's file is not the caller's (control comes back to a
  caller in another file when the callee's walk ends).
- unresolved: calls passing the value to neither a package function nor something
  plainly outside (a builtin, another package's import, a literal's method): an
  object's method (`before.with_model(model)`), a local function, `LOOPS[k](cfg)`.
"""

import ast
import builtins
import collections
import pathlib
import sys

CAP = 500
DEF = (ast.FunctionDef, ast.AsyncFunctionDef)
LITERAL = (ast.Constant, ast.JoinedStr, ast.List, ast.Tuple, ast.Dict, ast.Set,
           ast.ListComp, ast.SetComp, ast.DictComp)
# defs: top-level name -> FunctionDef | ClassDef; imports: local name -> dotted name.
Module = collections.namedtuple("Module", "name path defs imports")
Cls = collections.namedtuple("Cls", "mod node")
Func = collections.namedtuple("Func", "mod node cls bound")  # bound: self/cls given.


def load(path: pathlib.Path, root: pathlib.Path) -> Module:
  parts = path.relative_to(root).with_suffix("").parts
  pkg, tree = list(parts[:-1]), ast.parse(path.read_text(), str(path))
  m = Module(".".join(pkg if parts[-1] == "__init__" else parts), path,
             {n.name: n for n in tree.body if isinstance(n, DEF + (ast.ClassDef,))}, {})
  for n in ast.walk(tree):  # Imports inside functions included.
    for a in n.names if isinstance(n, ast.Import) else []:
      m.imports[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
    for a in n.names if isinstance(n, ast.ImportFrom) else []:
      base = pkg[:len(pkg) - n.level + 1] if n.level else []
      m.imports[a.asname or a.name] = ".".join(base + [n.module or "", a.name]).replace("..", ".")
  return m


def qualname(f: Func) -> str:
  return f"{f.cls.name}.{f.node.name}" if f.cls else f.node.name


class Walker:
  def __init__(self, root: pathlib.Path, callbacks=False):
    self.root, self.callbacks = root, callbacks
    self.mods = {m.name: m for m in (load(p, root) for p in sorted((root / "mpt").rglob("*.py")))}
    self.stays, self.unresolved, self.visited = [], 0, set()

  def dotted(self, name, depth=0):
    """What `mpt.x.y` is: a Module, Cls or Func (a submodule first), or None."""
    parent, _, last = name.rpartition(".")
    if name in self.mods or parent not in self.mods:
      return self.mods.get(name)
    return self.lookup(self.mods[parent], last, depth + 1)

  def lookup(self, mod, name, depth=0):
    node = mod.defs.get(name)
    if node:
      return Cls(mod, node) if isinstance(node, ast.ClassDef) else Func(mod, node, None, False)
    return self.dotted(mod.imports[name], depth) if name in mod.imports and depth < 8 else None

  def method(self, cls, name, depth=0):
    """Method `name` of `cls` or of a package base: a Func, or None."""
    for n in cls.node.body:
      if isinstance(n, DEF) and n.name == name:
        return Func(cls.mod, n, cls.node, "staticmethod" not in map(ast.unparse, n.decorator_list))
    for base in cls.node.bases if depth < 8 else []:
      r = self.resolve(cls.mod, None, base)
      found = isinstance(r, Cls) and self.method(r, name, depth + 1)
      if found:
        return found
    return None

  def resolve(self, mod, cls, expr):
    """What `expr` names: a Module, Cls or Func, or None."""
    names = chain(expr) or [None]
    r = Cls(mod, cls) if names[0] in ("self", "cls") and cls else \
        self.lookup(mod, names[0]) if names[0] else None
    for attr in names[1:]:
      r = self.dotted(f"{r.name}.{attr}") if isinstance(r, Module) else \
          self.method(r, attr) if isinstance(r, Cls) else None
    return r

  def callee(self, mod, cls, expr):
    """The Func `expr` calls, "none" (a package class without __init__), or None."""
    r = self.resolve(mod, cls, expr)
    if isinstance(r, Cls):
      return self.method(r, "__init__") or "none"
    return r if isinstance(r, Func) else None

  def outside(self, mod, func):
    """Whether `func` plainly lies outside the package (builtin, import, literal)."""
    while isinstance(func, ast.Attribute):
      func = func.value
    if isinstance(func, LITERAL):
      return True
    if not isinstance(func, ast.Name) or func.id in mod.defs or func.id in ("self", "cls"):
      return False
    if func.id in mod.imports:
      return mod.imports[func.id].split(".")[0] != "mpt"
    return hasattr(builtins, func.id)

  def walk(self, fn, params, stack=()):
    roots, tracked = set(params), set(params)
    stack += ((fn.mod.name, qualname(fn), frozenset(params)),)
    for ev in events(fn.node):
      if len(self.stays) >= CAP:
        return
      if isinstance(ev, tuple):  # ("bind", target, value)
        tracked |= names_in(ev[1], ast.Store) if names_in(ev[2]) & roots else set()
        continue
      target = self.callee(fn.mod, fn.cls, ev.func)
      via = passes(ev, tracked, target if isinstance(target, Func) else None)
      if via and isinstance(target, Func):
        self.stay(fn, ev, target, via, stack)
      elif via and target is None and not self.outside(fn.mod, ev.func):
        self.unresolved += 1
      for arg in ev.args + [k.value for k in ev.keywords] if self.callbacks else []:
        self.callback(fn, arg, tracked, stack)

  def callback(self, fn, arg, tracked, stack):
    if (chain(arg) or [])[:1] == ["self"] and len(chain(arg)) == 2 and "self" in tracked:
      cb = self.callee(fn.mod, fn.cls, arg)
      if isinstance(cb, Func) and cb.bound and cb.node.args.args and not any(
          "property" in ast.unparse(d) for d in cb.node.decorator_list):
        self.stay(fn, arg, cb, [(ast.unparse(arg), cb.node.args.args[0].arg)], stack)

  def stay(self, fn, site, target, via, stack):
    if len(self.stays) >= CAP:
      return
    src, dst = fn.mod.path, target.mod.path
    key = (target.mod.name, qualname(target), frozenset(p for _, p in via))
    self.stays.append(dict(
        file=self.rel(dst), line=target.node.lineno, name=key[1], via=via, cross=dst != src,
        site=f"{self.rel(src)}:{site.lineno}", depth=len(stack), again=key in stack,
        up=dst.parent in src.parent.parents, back=dst != src and dst in self.visited))
    self.stays[-1]["climb"] = self.stays[-1]["up"] or self.stays[-1]["back"]
    self.visited.add(dst)
    if key not in stack:
      self.walk(target, key[2], stack)

  def rel(self, path):
    return str(path.relative_to(self.root))


def chain(node):
  """`a.b.c` -> ["a", "b", "c"]; None for anything else."""
  out = []
  while isinstance(node, ast.Attribute):
    node, out = node.value, [node.attr] + out
  return [node.id] + out if isinstance(node, ast.Name) else None


def names_in(node, ctx=ast.AST):
  """The names `node` reads (ctx ast.Load) or binds (ast.Store: `a, *b`, not `self.x`)."""
  return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ctx)}


def passes(call, tracked, fn):
  """[(argument, receiving parameter)] for each tracked value `call` passes to `fn`
  (fn None: the parameters are None)."""
  a = fn.node.args if fn else ast.arguments([], [], None, [], [], None, [])
  pos = [p.arg for p in a.posonlyargs + a.args]
  first, pos = (pos[0], pos[1:]) if fn and fn.bound and pos else (None, pos)
  names, star, kw = pos + [p.arg for p in a.kwonlyargs], a.vararg, a.kwarg
  star, kw = star and star.arg, kw and kw.arg
  out = [(arg, pos[i] if i < len(pos) else star) for i, arg in enumerate(call.args)]
  out += [(k, k.arg if k.arg in names else kw if k.arg else (names[len(call.args):] + [kw])[0])
          for k in call.keywords]  # `**x`: the first parameter not bound by position.
  out = [(ast.unparse(x), p) for x, p in out if (chain(
      x.value if isinstance(x, (ast.Starred, ast.keyword)) else x) or [None])[0] in tracked]
  receiver = chain(call.func) or []
  if first and len(receiver) == 2 and receiver[0] in tracked:  # self.m(...) on a tracked self.
    out.insert(0, (receiver[0], first))
  return [(text, p) for text, p in out if p or not fn]


def events(node):
  """A function body's calls and bindings ("bind", target, value) in the order they
  happen: inner calls before outer ones, a value before its binding."""
  if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
    yield from events(node.iter)
    yield ("bind", node.target, node.iter)
    for child in getattr(node, "ifs", []) + getattr(node, "body", []) + getattr(node, "orelse", []):
      yield from events(child)
  elif isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
    last = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
    for child in node.generators + last:
      yield from events(child)
  elif isinstance(node, ast.withitem):
    yield from events(node.context_expr)
    if node.optional_vars:
      yield ("bind", node.optional_vars, node.context_expr)
  else:
    for child in ast.iter_child_nodes(node):
      if not (isinstance(node, DEF) and child is node.args):
        yield from events(child)
    if isinstance(node, ast.Call):
      yield node
    elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.NamedExpr)) and node.value:
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        yield ("bind", target, node.value)


def main(argv):
  (root, spec), flags = [a for a in argv if a[:2] != "--"], {a for a in argv if a[:2] == "--"}
  modname, funcname, param = spec.split(":")
  w = Walker(pathlib.Path(root).resolve(), callbacks="--callbacks" in flags)
  start = w.callee(w.mods[modname], None, ast.parse(funcname, mode="eval").body) \
      if modname in w.mods else None
  if not isinstance(start, Func):
    sys.exit(f"walk: no function {funcname} in {modname}")
  w.visited.add(start.mod.path)
  w.walk(start, {param})
  s, count = w.stays, lambda key: sum(bool(x[key]) for x in w.stays)
  files = {w.rel(start.mod.path)} | {x["file"] for x in s}
  print(f"stays {len(s)}{' (capped)' if len(s) >= CAP else ''}, files {len(files)}, "
        f"climbs {count('climb')} (up {count('up')}, back {count('back')}), "
        f"returns {count('cross')}, unresolved {w.unresolved}")
  if "--trace" in flags:
    print(f"   0 {w.rel(start.mod.path)}:{start.node.lineno} {qualname(start)} [{param}]")
    for i, x in enumerate(s, 1):
      marks = "".join(m for m, key in (("^", "up"), ("<", "back"), ("@", "again")) if x[key])
      via = ", ".join(f"{t}->{p}" for t, p in x["via"])
      print(f"{i:4} {'  ' * x['depth']}{x['file']}:{x['line']} {x['name']} [{via}] "
            f"from {x['site']} {marks}".rstrip())


if __name__ == "__main__":
  main(sys.argv[1:])
