"""One place where the command-line tools turn a user's mistake into one ``error: ...`` line and exit code 2.

A mistake found after the config is built (an unknown arch, a mistyped backbone keyword or ``mmplugin.`` type, a
checkpoint that is missing, unsafe or does not fit, a dataset that is not there) raises an exception whose text
already says what is wrong; a tool wrapped with :func:`tool_main` prints that text as ``error: <message>`` on stderr
and returns 2 instead of ending in a traceback below hundreds of log lines. A mistyped keyword or registry type
gets ``did you mean ...?`` with the closest valid names (:mod:`difflib`). Everything else (a bug) still raises.
``MMPLUGIN_TRACEBACK=1`` re-raises user errors too, with their traceback.
"""
from __future__ import annotations

import difflib
import functools
import inspect
import os
import re
import sys
from typing import Callable, Iterable

from mmplugin.utils.errors import UserError

__all__ = ['tool_main', 'run_tool', 'user_error_message', 'closest', 'TRACEBACK_ENV', 'CfgOptionError',
           'CfgOptionsAction', 'NEW_KEY_PREFIX', 'check_cfg_option_keys', 'nearest_config']

TRACEBACK_ENV = 'MMPLUGIN_TRACEBACK'

_REGISTRY_MISS = re.compile(r'(\S+) is not in the (?:(\w+)::)?([\w ]+?) registry')
_UNEXPECTED_KW = re.compile(r"(\w+)\.__init__\(\) got an unexpected keyword argument '(\w+)'")
_UNKNOWN_ARG = re.compile(r'- (\w+): unknown argument of ([\w.]+)')
_UNKNOWN_ARCH = re.compile(r"unknown arch '([^']+)'; valid: \[([^\]]*)\]")
_CONFIG_SYNTAX = 'There are syntax errors in config'


NEW_KEY_PREFIX = '+'  # --cfg-options +key=value: a key the config does not have yet, on purpose


class CfgOptionError(UserError, ValueError):
    """A ``--cfg-options`` item that is malformed or names a key the config does not have."""


def _cfg_options_action():
    from mmengine.config import DictAction

    class CfgOptionsAction(DictAction):
        """mmengine's ``DictAction`` (``key=value``, lists, tuples), with a one-line error for an item that is not
        ``KEY=VALUE`` (mmengine's ends in a traceback: "not enough values to unpack")."""

        def __call__(self, parser, namespace, values, option_string=None):
            for item in values:
                key, eq, _ = item.partition('=')
                if not eq or not key.lstrip(NEW_KEY_PREFIX):
                    raise CfgOptionError(f'{option_string} {item!r}: expected KEY=VALUE, e.g. '
                                         "model.backbone.arch=l1 (a key the config does not have yet: "
                                         f"{NEW_KEY_PREFIX}KEY=VALUE)")
            super().__call__(parser, namespace, values, option_string)
    return CfgOptionsAction


class _LazyAction:
    """``CfgOptionsAction`` built on first use, so importing this module does not import mmengine."""

    def __call__(self, *args, **kwargs):
        return _cfg_options_action()(*args, **kwargs)


CfgOptionsAction = _LazyAction()


def _runner_keys() -> set[str]:
    """Top-level keys mmengine's runners read from a config although a config need not set them."""
    from mmengine.runner import Runner
    keys = {p for p in inspect.signature(Runner.__init__).parameters if p != 'self'}
    try:
        from mmengine.runner import FlexibleRunner
        keys |= {p for p in inspect.signature(FlexibleRunner.__init__).parameters if p != 'self'}
    except ImportError:  # pragma: no cover - older mmengine
        pass
    return keys | {'runner_type', 'find_unused_parameters', 'model_wrapper_cfg'}


def check_cfg_option_keys(cfg, options) -> dict:
    """The ``--cfg-options`` dict to merge into ``cfg``, with probable typos refused.

    A top-level key neither the config nor mmengine's runners know, or a nested key missing where a sibling has a
    close name (``model.backbon.arch``) and the part's registered ``type`` takes no such argument, raises
    :class:`CfgOptionError` naming the nearest existing key; mmengine would merge it silently and the run would go
    on as if nothing had been given. Runner keys (``randomness.seed``, ``find_unused_parameters``), new arguments
    of a part (``model.backbone.with_cp=True``, ``model.backbone.drop_rate=0.1``) pass; ``+KEY=VALUE`` marks any
    key as intentionally new (and the keys under it given in the same call).
    """
    import copy
    out = {(k[len(NEW_KEY_PREFIX):] if k.startswith(NEW_KEY_PREFIX) else k): v for k, v in options.items()}
    new = {k[len(NEW_KEY_PREFIX):]: v for k, v in options.items() if k.startswith(NEW_KEY_PREFIX)}
    if new:  # the other keys are checked against the config with the new ones in it
        cfg = copy.deepcopy(cfg)
        cfg.merge_from_dict(copy.deepcopy(new))
    runner_keys = None
    for key in out:
        if key in new:
            continue
        node, path = cfg, []
        for depth, part in enumerate(key.split('.')):
            if isinstance(node, (list, tuple)) and part.isdigit():
                node = node[int(part)] if int(part) < len(node) else None
                path.append(part)
                continue
            if not hasattr(node, 'keys'):
                break
            if part in node:
                node = node[part]
                path.append(part)
                continue
            if depth == 0:
                runner_keys = _runner_keys() if runner_keys is None else runner_keys
                if part in runner_keys:
                    break
                near = closest(part, [str(k) for k in node.keys()] + sorted(runner_keys), n=1)
            else:
                cls = _find_class(str(node['type'])) if 'type' in node else None
                if cls is not None and part in _keywords(cls):
                    break
                near = closest(part, [str(k) for k in node.keys()], n=1, cutoff=0.8)
                if not near:
                    break
            where = '.'.join(path) or 'the config'
            hint = f"did you mean {'.'.join(path + near)!r}? " if near else ''
            raise CfgOptionError(f'--cfg-options {key}: {where} has no key {part!r}; {hint}'
                                 f'(a key meant to be new: {NEW_KEY_PREFIX}{key}=...)')
    return out


def closest(name: str, candidates: Iterable[str], n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The valid names nearest to the mistyped ``name`` (case-insensitive :func:`difflib.get_close_matches`)."""
    candidates = sorted(set(candidates))
    lower = {c.lower(): c for c in candidates}
    return [lower[c] for c in difflib.get_close_matches(name.lower(), list(lower), n=n, cutoff=cutoff)]


def _did_you_mean(names: list[str]) -> str:
    return f' (did you mean {" or ".join(repr(n) for n in names)}?)' if names else ''


def _registry_names(location: str) -> set[str]:
    """Every type name of mmengine's root registry called ``location`` (``'model'``, ``'dataset'``, ...) and of its
    children, scoped ones as ``scope.Name`` and, for a child, also bare (how a config in that scope writes it)."""
    import mmengine.registry as mm_registry
    roots = [r for r in vars(mm_registry).values() if isinstance(r, mm_registry.Registry) and r.name == location]
    names: set[str] = set()
    stack = list(roots)
    while stack:
        reg = stack.pop()
        names.update(reg.module_dict)
        if reg.parent is not None:
            names.update(f'{reg.scope}.{k}' for k in reg.module_dict)
        stack.extend(reg.children.values())
    return names


def _find_class(name: str):
    """The class registered as ``name`` (``mmplugin.SwinTransformer``, ``SwinTransformer``) in the model registries,
    the plugin's first; None when there is none."""
    from mmplugin.registry import MODELS
    scope, _, bare = name.rpartition('.')
    if scope in ('', 'mmplugin') and bare in MODELS.module_dict:
        return MODELS.module_dict[bare]
    import mmengine.registry as mm_registry
    stack = [mm_registry.MODELS]
    while stack:
        reg = stack.pop()
        if (not scope or reg.scope == scope) and bare in reg.module_dict:
            return reg.module_dict[bare]
        stack.extend(reg.children.values())
    return None


def _keywords(cls) -> set[str]:
    """The keyword arguments ``cls(...)`` accepts: its and its bases' ``__init__`` parameters."""
    names: set[str] = set()
    for klass in getattr(cls, '__mro__', ()):
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        try:
            params = inspect.signature(init).parameters.values()
        except (TypeError, ValueError):
            continue
        names.update(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return names - {'self'}


def _keyword_hint(cls_name: str, kw: str) -> str:
    cls = _find_class(cls_name)
    return _did_you_mean(closest(kw, _keywords(cls))) if cls is not None else ''


def _with_keyword_hints(message: str) -> str:
    """``message`` with ``did you mean`` after every unknown keyword it names whose class is registered."""
    message = _UNKNOWN_ARG.sub(lambda m: m.group(0) + _keyword_hint(m.group(2), m.group(1)), message)
    return _UNEXPECTED_KW.sub(lambda m: m.group(0) + _keyword_hint(m.group(1), m.group(2)), message)


def _is_user_error(err: BaseException) -> bool:
    from mmengine.config.utils import ConfigParsingError

    if isinstance(err, UserError):  # the plugin's own: every "you made a mistake" exception derives from it
        return True
    # third-party exceptions that mean a user's mistake (a missing file, an unparsable config, a mistyped type or
    # keyword in a config), recognised by type and by the registry's / Python's own wording
    if isinstance(err, (FileNotFoundError, ConfigParsingError)):
        return True
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    if isinstance(err, KeyError):
        return bool(_REGISTRY_MISS.search(text))
    if isinstance(err, SyntaxError):
        return text.startswith(_CONFIG_SYNTAX)
    if isinstance(err, TypeError):
        return bool(_UNEXPECTED_KW.search(text))
    return False


def user_error_message(err: BaseException) -> str | None:
    """The one-line (or few-line) text to print for a user's mistake, with ``did you mean`` where a name was
    mistyped; None when ``err`` is not one (a bug: let it raise)."""
    try:
        if not _is_user_error(err):
            return None
    except ImportError:  # the package's own modules could not load: not a user error either
        return None
    text = str(err.args[0]) if isinstance(err, KeyError) and err.args else str(err)
    miss = _REGISTRY_MISS.search(text)
    if isinstance(err, KeyError) and miss:
        name, _, location = miss.groups()
        text = text.split('. Please check')[0] + _did_you_mean(closest(name, _registry_names(location)))
    else:
        text = _with_keyword_hints(text)
        arch = _UNKNOWN_ARCH.search(text)
        if arch:
            text += _did_you_mean(closest(arch.group(1), re.findall(r"'([^']+)'", arch.group(2))))
    return text.strip()


def add_retain_memory_option(p) -> None:
    """``--retain-memory`` of the timing tables: keep freed memory in the process for every row."""
    p.add_argument('--retain-memory', action='store_true',
                   help="keep freed memory in the process for every row (what --fast does on CPUs; "
                        "mmplugin.inference.allocator): compare with a run without it")


def apply_retain_memory_option(p, args) -> None:
    """Apply ``--retain-memory`` if given; a parser error where the C library cannot (not glibc)."""
    if args.retain_memory:
        from mmplugin.inference.allocator import retain_freed_memory
        if not retain_freed_memory():
            p.error('--retain-memory needs glibc (this C library is not)')


def require_files(*named: tuple[str, str | None], urls: bool = False) -> None:
    """Raise ``FileNotFoundError('<what> file not found: <path>')`` (one ``error:`` line through
    :func:`tool_main`) for the first ``(what, path)`` whose file is missing; ``None`` paths are optional, and with
    ``urls`` a checkpoint may be a URL (downloaded later)."""
    from mmplugin.checkpoint import is_url
    for what, path in named:
        if path and not os.path.isfile(path) and not (urls and what == 'checkpoint' and is_url(path)):
            hint = ''
            if what == 'config':
                hint = nearest_config(path)
            raise FileNotFoundError(f'{what} file not found: {path}{hint}')


def _reattach_closed_log_streams() -> None:
    """Point console log handlers whose stream was closed (a tool called in-process after the caller swapped and
    closed ``sys.stdout`` / ``sys.stderr``, as test capture does) at the current ``sys.stdout``: otherwise the
    first log line of the next call prints ``--- Logging error ---`` with a traceback instead of the message."""
    import logging
    loggers = [logging.getLogger()] + [lg for lg in logging.Logger.manager.loggerDict.values()
                                       if isinstance(lg, logging.Logger)]
    mm = sys.modules.get('mmengine.logging')  # MMLogger instances are kept outside logging's registry
    if mm is not None and hasattr(mm, 'MMLogger'):
        loggers += list(getattr(mm.MMLogger, '_instance_dict', {}).values())
    for lg in loggers:
        for h in lg.handlers:
            if type(h) is logging.StreamHandler and getattr(h.stream, 'closed', False):
                h.acquire()
                try:  # not setStream(): it flushes the closed stream first
                    h.stream = sys.stdout
                finally:
                    h.release()


def tool_main(main: Callable[..., object]) -> Callable[..., object]:
    """Wrap a tool's ``main(argv=None)``: user errors print ``error: <message>`` on stderr and return 2.

    ``MMPLUGIN_TRACEBACK=1`` in the environment re-raises them instead (with the full traceback).
    """
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        _reattach_closed_log_streams()
        try:
            rc = main(*args, **kwargs)
        except Exception as err:  # noqa: BLE001  (sorted out below: only user errors are caught)
            message = user_error_message(err)
            if message is None or os.environ.get(TRACEBACK_ENV, '') not in ('', '0'):
                raise
            print(f'error: {message}', file=sys.stderr, flush=True)
            return 2
        return rc

    return wrapper


def run_tool(main: Callable[[], object]) -> None:
    """``sys.exit`` with ``main()``'s exit code: an int as it is, anything else (a tool returning its figures for
    tests) 0."""
    rc = main()
    sys.exit(rc if isinstance(rc, int) else 0)


def nearest_config(path: str) -> str:
    """`` (did you mean ...?)`` with the config files nearest in name to a missing ``path``: those of its folder
    and of the plugin's configs (every family and task folder), or '' when none is close."""
    import glob

    from mmplugin.config_scope import config_root
    folder = os.path.dirname(path) or '.'
    pool = set(glob.glob(os.path.join(folder, '*.py'))) if os.path.isdir(folder) else set()
    root = os.path.realpath(config_root())  # the installed configs are a link to the source tree's
    pool |= {p for p in glob.glob(os.path.join(root, '**', '*.py'), recursive=True) if '_base_' not in p}
    by_name: dict[str, list[str]] = {}
    for p in sorted({os.path.relpath(os.path.realpath(p)) for p in pool}):
        by_name.setdefault(os.path.basename(p), []).append(p)
    found = [p for n in closest(os.path.basename(path), by_name, n=2, cutoff=0.8) for p in by_name[n]][:3]
    return f' (did you mean {" or ".join(found)}?)' if found else ''
