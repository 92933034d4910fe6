"""Check that a config's datasets exist before anything expensive is built, and say how to get them."""
from __future__ import annotations

import json
import os
import os.path as osp

from mmplugin.utils.errors import UserError

__all__ = ['DatasetConfigError', 'DatasetMissingError', 'DatasetClassesError', 'check_datasets',
           'annotation_categories']

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
                   'config without the semantic branch (configs/swin/swin_l_htcpp_nosemantic_6x_coco.py)'),
}


class DatasetConfigError(UserError):
    """A config's dataset cannot be used as configured (the tools print the message and exit with status 2)."""


class DatasetMissingError(DatasetConfigError, FileNotFoundError):
    """A dataset a config needs is not on disk."""


class DatasetClassesError(DatasetConfigError, ValueError):
    """A config's class names match none of its COCO-format annotation file's categories."""


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
    """Raise :class:`DatasetMissingError` naming every missing path of the given splits, with download hints, then
    :class:`DatasetClassesError` when a COCO-format dataset's class names match none of its annotation file's
    categories (see :func:`check_class_names`).

    Args:
        cfg: an mmengine ``Config``.
        splits: which of ``{split}_dataloader`` to check.
    """
    problems, kinds, own = [], set(), False
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
                    hint = 'COCO-stuff' if stuff else kind.split('.')[-1]
                    if hint in _HINTS and _public_layout(hint, path):
                        kinds.add(hint)
                    else:
                        own = True
    if problems:
        lines = ['dataset files are missing:'] + problems
        for kind in sorted(kinds):
            name, layout, url = _HINTS[kind]
            lines.append(f'{name} is expected as {layout}; get it from {url}.')
        if own:  # the user's own data (a custom template): its paths are the variables at the top of the config
            lines.append('Your own data: set data_root and the annotation / image paths at the top of the config '
                         'to where the files are (docs/custom_data.md, "Train on your own data").')
        lines.append('Elsewhere than the config says: edit its data_root, or override every key that holds it: '
                     + ' '.join(f'{k}={"FILE" if k.endswith("ann_file") else "PATH"}' for k in _root_keys(cfg, splits))
                     + '. No data at hand: the bundled demo, bash tools/demo.sh')
        raise DatasetMissingError('\n'.join(lines))
    check_class_names(cfg, splits)


# what the public datasets' own file names contain (their hints only apply to paths of that layout, wherever the
# data root is; a custom template's 'annotations/instances_train.json' is the user's own data)
_PUBLIC_NAMES = {'CocoDataset': '2017', 'COCO-stuff': 'stuffthingmaps', 'ADE20KDataset': 'ADEChallengeData2016'}


def _public_layout(kind: str, path: str) -> bool:
    return _PUBLIC_NAMES[kind] in path


def _root_keys(cfg, splits) -> list[str]:
    """The final config keys that carry the dataset location: each dataloader's data_root and the COCO
    evaluators' annotation files (mmengine's ``--cfg-options data_root=...`` reaches none of them)."""
    keys = [f'{split}_dataloader.dataset.data_root' for split in ('train', 'val', 'test')
            if split in splits or split != 'train' and cfg.get(f'{split}_dataloader')]
    for split in ('val', 'test'):
        ev = cfg.get(f'{split}_evaluator')
        for i, e in enumerate(ev if isinstance(ev, (list, tuple)) else [ev]):
            if isinstance(e, dict) and e.get('ann_file'):
                keys.append(f'{split}_evaluator.ann_file' if not isinstance(ev, (list, tuple))
                            else f'{split}_evaluator.{i}.ann_file')
    return keys


_TAIL_BYTES = 4 << 20  # COCO writes 'categories' last: the tail of a large file holds it
_WHOLE_FILE_LIMIT = 64 << 20


def annotation_categories(path: str) -> list[str] | None:
    """The category names of a COCO-format annotation file, or ``None`` when they cannot be read cheaply.

    Files up to 64 MiB are parsed whole; of larger ones (``instances_train2017.json``: 448 MiB) only the last
    4 MiB are read, where COCO's own files and ``json.dump`` of a dict in COCO's key order keep ``categories``.
    """
    size = os.path.getsize(path)
    with open(path, 'rb') as f:
        if size <= _WHOLE_FILE_LIMIT:
            try:
                data = json.loads(f.read())
            except ValueError:
                return None
            cats = data.get('categories') if isinstance(data, dict) else None
            return [c.get('name') for c in cats] if isinstance(cats, list) else None
        f.seek(max(0, size - _TAIL_BYTES))
        tail = f.read().decode('utf-8', errors='ignore')
    at = tail.rfind('"categories"')
    if at < 0:
        return None
    start = tail.find('[', at)
    try:
        cats, _ = json.JSONDecoder().raw_decode(tail[start:])
    except ValueError:
        return None
    return [c.get('name') for c in cats if isinstance(c, dict)] if isinstance(cats, list) else None


def _config_classes(ds: dict):
    """The class names a dataset config selects: its ``metainfo.classes``, else its class's ``METAINFO``."""
    meta = ds.get('metainfo') or {}
    if meta.get('classes'):
        return list(meta['classes']), 'metainfo.classes'
    try:
        from mmdet.registry import DATASETS
        cls = DATASETS.get(ds.get('type'))
    except ImportError:
        return None, None
    classes = getattr(cls, 'METAINFO', {}).get('classes') if cls is not None else None
    return (list(classes), f'{ds.get("type")}.METAINFO (no metainfo in the config)') if classes else (None, None)


def check_class_names(cfg, splits=('train', 'val', 'test')) -> None:
    """Raise :class:`DatasetClassesError` when a COCO-format dataset of ``splits`` names classes of which none is a
    category of its annotation file.

    mmdet's ``CocoDataset`` keeps only the annotation file's categories whose names are in the config's classes
    (mmdet's 80 COCO names when the config sets no ``metainfo``) and then drops the images without any of them; when
    nothing matches, every image is filtered out and training dies much later in a sampler with "need at least one
    array to concatenate". Changing ``num_classes`` in the heads does not change the names.
    """
    problems = []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        if not loader:
            continue
        for ds in _leaf_datasets(loader.get('dataset')):
            ann = ds.get('ann_file')
            if not ann or not str(ann).endswith('.json'):
                continue
            path = _join(ds.get('data_root', '') or '', ann)
            if not osp.isfile(path):
                continue
            names = annotation_categories(path)
            classes, source = _config_classes(ds)
            if not names or not classes or set(names) & set(classes):
                continue
            shown = ', '.join(repr(c) for c in classes[:5]) + (', ...' if len(classes) > 5 else '')
            problems.append(f'  [{split}] {path}: categories {names[:10]}{" ..." if len(names) > 10 else ""}; '
                            f'the config\'s classes ({source}, {len(classes)}): {shown}')
    if problems:
        raise DatasetClassesError(
            'the config\'s class names match none of the annotation file\'s categories, so mmdet would drop every '
            'image:\n' + '\n'.join(problems) + '\nSet the class names of your dataset in every dataloader (and '
            'num_classes in the heads), e.g. metainfo = dict(classes=(...)) and '
            'train_dataloader = dict(dataset=dict(metainfo=metainfo)) (likewise val_ / test_dataloader).')
