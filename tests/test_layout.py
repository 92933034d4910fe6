"""Package layout: every ``mmplugin`` module imports on its own in an interpreter that has imported no other
``mmplugin`` module (so no import circle and no reliance on import order), and no module is longer than
``MAX_LINES`` lines unless its opening docstring says why (``REASON_MARKER``)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / 'mmplugin'
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
    assert 'mmplugin.models.backbones.swin' in names and 'mmplugin' in names
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
