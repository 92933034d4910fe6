"""Check that a config's datasets exist before anything expensive is built, and say how to get them."""
from __future__ import annotations

import os.path as osp

__all__ = ['DatasetMissingError', 'check_datasets']

_HINTS = {
    'CocoDataset': ('COCO 2017', 'data/coco/{annotations/instances_train2017.json, annotations/instances_val2017.json, '
                    'train2017/, val2017/}', 'https://cocodataset.org/#download (2017 Train/Val images and '
                    '2017 Train/Val annotations)'),
    'ADE20KDataset': ('ADE20K (ADEChallengeData2016)', 'data/ade/ADEChallengeData2016/{images,annotations}/'
                      '{training,validation}/', 'http://data.csail.mit.edu/places/ADEchallenge/'
                      'ADEChallengeData2016.zip (unzip into data/ade/)'),
    # the semantic branch of HTC / HTC++ (data_prefix seg= of a COCO dataset) reads COCO-stuff label maps
    'COCO-stuff': ('COCO-stuff (the stuffthingmaps read by the semantic branch of HTC / HTC++)',
                   'data/coco/stuffthingmaps/{train2017,val2017}/ (one PNG label map per image)',
                   'http://calvin.inf.ed.ac.uk/wp-content/uploads/data/cocostuffdataset/'
                   'stuffthingmaps_trainval2017.zip (unzip into data/coco/stuffthingmaps/); without it, train a '
                   'config without the semantic branch (configs/swin_l_htcpp_nosemantic_6x.py)'),
}


class DatasetMissingError(FileNotFoundError):
    """A dataset a config needs is not on disk."""


def _leaf_datasets(ds):
    if not isinstance(ds, dict):
        return []
    if 'datasets' in ds:
        return [d for sub in ds['datasets'] for d in _leaf_datasets(sub)]
    if 'dataset' in ds:
        return _leaf_datasets(ds['dataset'])
    return [ds]


def _join(root: str, path: str) -> str:
    return path if not root or osp.isabs(path) else osp.join(root, path)


def check_datasets(cfg, splits=('train', 'val', 'test')) -> None:
    """Raise :class:`DatasetMissingError` naming every missing path of the given splits, with download hints.

    Args:
        cfg: an mmengine ``Config``.
        splits: which of ``{split}_dataloader`` to check.
    """
    problems, kinds = [], set()
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for ds in _leaf_datasets(loader.get('dataset')):
            root = ds.get('data_root', '') or ''
            kind = ds.get('type', '?')
            paths = []
            if ds.get('ann_file'):
                paths.append(('annotation file', _join(root, ds['ann_file']), osp.isfile))
            for key, sub in (ds.get('data_prefix') or {}).items():
                if sub:
                    paths.append((f'{key} folder', _join(root, sub), osp.isdir))
            if not paths and root:
                paths.append(('data root', root, osp.isdir))
            for what, path, exists in paths:
                if not exists(path):
                    problems.append(f'  [{split}] {kind}: {what} not found: {path}')
                    stuff = what == 'seg folder' and 'Coco' in kind
                    kinds.add('COCO-stuff' if stuff else kind.split('.')[-1])
    if problems:
        lines = ['dataset files are missing:'] + problems
        for kind in sorted(kinds):
            if kind in _HINTS:
                name, layout, url = _HINTS[kind]
                lines.append(f'{name} is expected as {layout}; get it from {url}.')
        lines.append('Point the config elsewhere with --cfg-options train_dataloader.dataset.data_root=PATH '
                     '(and val_/test_dataloader likewise), or run the bundled demo: bash tools/demo.sh')
        raise DatasetMissingError('\n'.join(lines))
