"""Package layout: every ``mmplugin`` module imports on its own in an interpreter that has imported no other
``mmplugin`` module (so no import circle and no reliance on import order), and no module is longer than
``MAX_LINES`` lines unless its opening docstring says why (``REASON_MARKER``)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / 'mmplugin'
MAX_LINES = 350
REASON_MARKER = 'Longer than 350 lines because'

# Run in a fresh interpreter: import every module once to learn which third-party modules they use, then, in a
# second fresh interpreter, import only those and fork one child per module; each child starts without any
# mmplugin module and imports one. Third-party imports are shared, so the check takes seconds, not minutes.
_CHECK = r'''
import importlib, json, os, sys, traceback
names = json.loads(sys.argv[1])
if sys.argv[2] == 'deps':
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    print(json.dumps([m for m in list(sys.modules) if m.split('.')[0] != 'mmplugin']))
    sys.exit(0)
for dep in json.loads(sys.argv[2]):
    try:
        importlib.import_module(dep)
    except Exception:
        pass
assert not [m for m in sys.modules if m.split('.')[0] == 'mmplugin']
failures = {}
for name in names:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            importlib.import_module(name)
            msg = ''
        except BaseException:
            msg = traceback.format_exc(limit=-4)
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    _, status = os.waitpid(pid, 0)
    if msg or status:
        failures[name] = msg or f'exit status {status}'
print(json.dumps(failures))
'''


def _module_names() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        names.append('.'.join(parts[:-1] if parts[-1] == '__init__' else parts))
    return names


def _run(names: list[str], mode: str) -> str:
    proc = subprocess.run([sys.executable, '-c', _CHECK, json.dumps(names), mode], capture_output=True, text=True,
                          cwd=PACKAGE.parent, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1]


def test_every_module_imports_alone():
    names = _module_names()
    assert 'mmplugin.models.backbones.swin.model' in names and 'mmplugin' in names
    deps = _run(names, 'deps')
    failures = json.loads(_run(names, deps))
    assert not failures, '\n\n'.join(f'{name}:\n{msg}' for name, msg in failures.items())


def test_modules_are_short_or_say_why():
    too_long = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        text = path.read_text()
        n = len(text.splitlines())
        if n > MAX_LINES and REASON_MARKER not in (ast.get_docstring(ast.parse(text)) or ''):
            too_long[str(path.relative_to(PACKAGE.parent))] = n
    assert not too_long, f'modules over {MAX_LINES} lines without "{REASON_MARKER} ..." in their docstring: {too_long}'


# ---------------------------------------------------------------- the structure plan: who may import whom
# A module may import its own package and the packages listed for it (prefixes of dotted names). Loading that
# knows the model sits above models/; checkpoint/ and utils/ know no model; export/ and quantization/ never reach
# the tools or the measurements. Imports under ``if TYPE_CHECKING:`` are not counted (type-only).
MAY_IMPORT = {
    'mmplugin.utils': (),
    'mmplugin.checkpoint': ('mmplugin.utils',),
    'mmplugin.reference': (),
    'mmplugin.ops': ('mmplugin.utils',),  # kernels: no model, no registry
    'mmplugin.models': ('mmplugin.utils', 'mmplugin.checkpoint', 'mmplugin.registry', 'mmplugin.ops'),
    'mmplugin.loading': ('mmplugin.utils', 'mmplugin.checkpoint', 'mmplugin.models'),
    'mmplugin.engine': ('mmplugin.utils', 'mmplugin.checkpoint', 'mmplugin.models', 'mmplugin.registry'),
    'mmplugin.inference': ('mmplugin.utils', 'mmplugin.models', 'mmplugin.export'),  # --runtime: ONNX of extract_feat
    'mmplugin.export': ('mmplugin.utils', 'mmplugin.models'),
    'mmplugin.quantization': ('mmplugin.utils', 'mmplugin.checkpoint', 'mmplugin.models', 'mmplugin.export',
                              'mmplugin.apis', 'mmplugin.analysis.bench'),
}


def _imports(path: Path, module: str) -> set[str]:
    """Dotted ``mmplugin`` names that ``path`` imports anywhere (module level or in a function)."""
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree)
                 if isinstance(node, ast.If) and 'TYPE_CHECKING' in ast.unparse(node.test) for n in ast.walk(node)}
    package = module if path.name == '__init__.py' else module.rpartition('.')[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                base = '.'.join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out.add(base)
            out.update(f'{base}.{a.name}' for a in node.names)
    return {name for name in out if name.split('.')[0] == 'mmplugin'}


def _graph() -> dict[str, set[str]]:
    names = set(_module_names())
    graph = {}
    for path in sorted(PACKAGE.rglob('*.py')):
        parts = path.relative_to(PACKAGE.parent).with_suffix('').parts
        module = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
        targets = set()
        for name in _imports(path, module):
            while name and name not in names:  # 'pkg.mod.function' -> 'pkg.mod'
                name = name.rpartition('.')[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    graph = _graph()
    assert 'mmplugin.loading.whole_model' in graph['mmplugin.loading.fit']  # the graph sees function-level imports
    assert not _cycles(graph)
    assert _cycles({'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}}) == [['a', 'b', 'c']]


def test_no_import_climbs_the_layers():
    climbing = []
    for module, targets in _graph().items():
        rule = next((k for k in sorted(MAY_IMPORT, key=len, reverse=True) if module == k or module.startswith(k + '.')),
                    None)
        if rule is None:
            continue
        allowed = (rule, *MAY_IMPORT[rule])
        climbing += [f'{module} -> {t}' for t in sorted(targets)
                     if not any(t == a or t.startswith(a + '.') for a in allowed)]
    assert not climbing, 'imports against the structure plan:\n' + '\n'.join(climbing)
