"""Which OpenMMLab stack is installed: the original distributions or the maintained onedl-* forks.

Both provide the same import names (``mmengine``, ``mmcv``, ``mmdet``, ``mmseg``) under different distribution
names, so the plugin's package metadata names neither (``pip install mmplugin`` never replaces or duplicates the
stack of an environment): ``pip install mmplugin[openmmlab]`` or ``mmplugin[onedl]`` choose one, with the version
ranges they were tested with; the exact tested versions are the constraints files ``requirements/openmmlab.txt`` and
``requirements/onedl.txt`` (``tools/setup_env.sh`` builds either, ``MMPLUGIN_STACK=onedl`` for the forks).

Run as a script (``python mmplugin/utils/stack.py``) it prints the installed stack, one line; it reads package
metadata only and imports nothing else (it runs where mmplugin itself would not import).
"""
from __future__ import annotations

from importlib import metadata

__all__ = ['STACKS', 'installed_distributions', 'installed_stack', 'duplicated_packages', 'missing_packages']

#: import name -> the distribution that provides it in each stack
STACKS = {
    'openmmlab': {'mmengine': 'mmengine', 'mmcv': 'mmcv', 'mmdet': 'mmdet', 'mmseg': 'mmsegmentation'},
    'onedl': {'mmengine': 'onedl-mmengine', 'mmcv': 'onedl-mmcv', 'mmdet': 'onedl-mmdetection',
              'mmseg': 'onedl-mmsegmentation'},
}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_distributions() -> dict[str, dict[str, str]]:
    """``{import name: {distribution: version}}`` of every installed distribution that provides an OpenMMLab
    package (``mmcv-lite`` counts for ``mmcv``)."""
    out: dict[str, dict[str, str]] = {}
    for stack in STACKS.values():
        for name, dist in stack.items():
            v = _version(dist)
            if v is not None:
                out.setdefault(name, {})[dist] = v
    lite = _version('mmcv-lite')
    if lite is not None:
        out.setdefault('mmcv', {})['mmcv-lite'] = lite
    return out


def installed_stack() -> str | None:
    """``'openmmlab'`` or ``'onedl'`` when every package comes from that stack, ``'mixed'`` when they come from
    both, None when none is installed."""
    found = installed_distributions()
    kinds = {next((k for k, s in STACKS.items() if dist in s.values()), 'openmmlab')
             for dists in found.values() for dist in dists}
    return None if not kinds else (kinds.pop() if len(kinds) == 1 else 'mixed')


def duplicated_packages() -> str | None:
    """One line naming every import name that two installed distributions provide (they overwrite each other's
    files: an original and a fork installed together), else None."""
    twice = {name: dists for name, dists in installed_distributions().items() if len(dists) > 1}
    if not twice:
        return None
    listed = '; '.join(f'{name} from {", ".join(f"{d} {v}" for d, v in dists.items())}'
                       for name, dists in twice.items())
    return (f'two distributions provide the same OpenMMLab package ({listed}); keep one stack: pip uninstall the '
            'other, then reinstall the kept one')


def missing_packages() -> str | None:
    """One line naming the OpenMMLab packages no distribution provides, and how to install a stack, else None."""
    found = installed_distributions()
    missing = [name for name in STACKS['openmmlab'] if name not in found]
    if not missing:
        return None
    return (f'{", ".join(missing)} not installed; install one stack: pip install "mmplugin[openmmlab]" (mmengine, '
            'mmcv, mmdet, mmsegmentation) or "mmplugin[onedl]" (the maintained onedl-* forks); mmcv needs its '
            'compiled ops (tools/setup_env.sh builds them)')


if __name__ == '__main__':
    found = installed_distributions()
    print(f'{installed_stack()}: ' + ', '.join(f'{d} {v}' for dists in found.values() for d, v in dists.items()))
