"""``mmplugin::`` config paths: inherit the plugin's configs from any project.

mmengine resolves ``_base_ = ['mmdet::...']`` only for the OpenMMLab packages it lists, from the installed package's
``.mim/configs``; for any other prefix it stops with ``AssertionError: mmengine does not support to load mmplugin
config`` (and it requires a folder in the path). Importing :mod:`mmplugin` installs :func:`install_config_scope`,
after which mmengine reads::

    _base_ = ['mmplugin::swin/swin_t_maskrcnn_1x_coco.py']          # configs/swin/swin_t_maskrcnn_1x_coco.py
    _base_ = ['mmplugin::_base_/swin_maskrcnn.py']        # configs/_base_/swin_maskrcnn.py

The configs live in the repository's ``configs/``; the package reaches them as ``mmplugin/.mim/configs`` (a link in
the source tree, so an editable install reads the repository's files; real files in a wheel, which ships them).

mmengine reads ``_base_`` before it imports ``custom_imports``, so ``mmplugin`` must be imported before the config is
read: the plugin's tools do this; elsewhere see docs/configuring.md ("Inheriting the plugin's configs from your
own project").
"""
from __future__ import annotations

from pathlib import Path

PREFIX = 'mmplugin::'

__all__ = ['PREFIX', 'config_root', 'config_file', 'install_config_scope']


def config_root() -> Path:
    """The folder holding the plugin's configs (``<package>/.mim/configs``)."""
    root = Path(__file__).resolve().parent / '.mim' / 'configs'
    if not (root / '_base_').is_dir():
        raise FileNotFoundError(
            f'the plugin configs are missing: {root} does not exist. In a source checkout it is a link to the '
            'repository\'s configs/ (restore it with `git checkout mmplugin/.mim`); a wheel ships the files there '
            '(rebuild it with `python -m build`).')
    return root


def config_file(name: str) -> Path:
    """Absolute path of the plugin config ``name`` (``'swin/swin_t_maskrcnn_1x_coco.py'``,
    ``'_base_/swin_maskrcnn.py'``; a leading ``mmplugin::`` is accepted). Raises FileNotFoundError listing the
    available configs."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f'config name must be a non-empty string such as {PREFIX}swin/swin_t_maskrcnn_1x_coco.py, '
                         f'got {name!r}')
    rel = name[len(PREFIX):] if name.startswith(PREFIX) else name
    root = config_root()
    path = (root / rel).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f'{PREFIX}{rel} points outside the plugin configs; name a file under {root}')
    if not path.is_file():
        # the model configs, one folder per family (the flat former paths are stubs and not listed)
        shipped = sorted(p.relative_to(root).as_posix() for p in root.glob('*/*.py')
                         if p.parent.name not in ('_base_', 'demo', 'deploy'))
        raise FileNotFoundError(f'no plugin config {PREFIX}{rel} (looked for {path}). Model configs: '
                                f'{", ".join(shipped)}; bases are under {PREFIX}_base_/')
    return path


def install_config_scope() -> None:
    """Teach mmengine's ``Config`` the ``mmplugin::`` prefix (idempotent; other prefixes are left to mmengine).

    The resolved base gets no registry scope: the plugin's configs are mmdet / mmseg configs whose own bases set
    the scope, and an ``mmplugin`` scope would hide mmdet's and mmseg's models from the builders.
    """
    from mmengine.config import Config

    original = Config.__dict__['_get_cfg_path']
    original_fn = original.__func__ if isinstance(original, staticmethod) else original
    if getattr(original_fn, '_mmplugin_scope', False):
        return

    def _get_cfg_path(cfg_path: str, filename: str):
        if isinstance(cfg_path, str) and cfg_path.startswith(PREFIX):
            return str(config_file(cfg_path)), None
        try:
            return original_fn(cfg_path, filename)
        except ModuleNotFoundError:
            found = _from_import_name(cfg_path)
            if found is None:
                raise
            return found

    _get_cfg_path._mmplugin_scope = True  # type: ignore[attr-defined]
    Config._get_cfg_path = staticmethod(_get_cfg_path)


def _from_import_name(cfg_path: str):
    """``(path, scope)`` of an ``mmseg::`` / ``mmdet::`` ... base found through the package's import name.

    mmengine looks the scope up by its original distribution name (``mmseg`` -> ``mmsegmentation``), which the
    maintained forks do not have (``onedl-mmsegmentation`` installs the same ``mmseg`` package). The configs live
    in the imported package's ``.mim/configs`` either way. None when no such package can be imported.
    """
    import importlib.util
    import os.path as osp

    from mmengine.config.utils import _get_external_cfg_base_path, _get_external_cfg_path, _get_package_and_cfg_path
    if '::' not in cfg_path:
        return None
    scope = cfg_path.partition('::')[0]
    spec = importlib.util.find_spec(scope)
    if spec is None or spec.origin is None:
        return None
    package_path = osp.dirname(spec.origin)
    _, rel = _get_package_and_cfg_path(cfg_path)
    try:
        return _get_external_cfg_path(package_path, rel), scope
    except ValueError:
        return _get_external_cfg_base_path(package_path, rel), scope
