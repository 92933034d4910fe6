"""The model zoo: model-index.yml, the metafiles it imports, and the tables of docs/model_zoo.md (and of README.md's
model-zoo section once it has one) describe the same models with the same numbers.

References the entries are checked against: the configs themselves (schedule, batch, task), the installed mmdet /
mmseg packages' own Swin metafiles (URL, numbers, schedule, memory of every entry they published), and the
parameter counts the official repositories and the Swin paper publish for each architecture (the model built from
the config on the ``meta`` device, so no weights are allocated). Nothing is downloaded.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import yaml
from mmengine.config import Config

import mmplugin
from mmplugin.zoo import get_model, index_file, load_models, read_markdown_table

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / 'configs'
FAMILY_DIRS = ('swin', 'swinv2', 'swiftformer', 'comparison')  # the zoo's config folders, each with its metafile
# the configs the zoo lists: the recipes at the top level and the SwiftFormer paper's comparison rows
# the worked RetinaNet example of configs/custom/ is listed with the SwiftFormer models
ZOO_CONFIGS = sorted(p for d in FAMILY_DIRS for p in (CONFIGS / d).glob('*.py')) + [
    CONFIGS / 'custom' / 'swiftformer_l1_retinanet_1x_coco.py']
ZOO_DOC = ROOT / 'docs' / 'model_zoo.md'
# The section of docs/model_zoo.md, and of README.md when it has one, that lists every published checkpoint.
CHECKPOINT_HEADING = 'Published checkpoints'
# The section of docs/model_zoo.md that lists the configs no checkpoint exists for.
NO_CHECKPOINT_HEADING = 'Configs without a published checkpoint'

TASKS = {'Object Detection': {'box AP'}, 'Instance Segmentation': {'mask AP'},
         'Semantic Segmentation': {'mIoU', 'mIoU(ms+flip)'}}
# Source repositories of the published checkpoints: those that publish at a commit, and the OpenMMLab zoos (a
# release, whose metafile ships inside the installed package).
AT_COMMIT = {'SwinTransformer/Swin-Transformer-Object-Detection',
             'SwinTransformer/Swin-Transformer-Semantic-Segmentation'}
AT_RELEASE = {'open-mmlab/mmdetection': 'mmdet', 'open-mmlab/mmsegmentation': 'mmseg'}
# Method names of metafile "Architecture" lists, by the model and head types the configs build.
METHODS = {'MaskRCNN': 'Mask R-CNN', 'CascadeRCNN': 'Cascade Mask R-CNN', 'HybridTaskCascade': 'HTC++',
           'ATSS': 'ATSS', 'SparseRCNN': 'Sparse R-CNN', 'RetinaNet': 'RetinaNet', 'UPerHead': 'UPerNet',
           'FPNHead': 'Semantic FPN'}


@functools.lru_cache(maxsize=None)
def _models() -> tuple[dict, ...]:
    return tuple(load_models(ROOT / 'model-index.yml'))


@functools.lru_cache(maxsize=None)
def _cfg(config: str) -> Config:
    return Config.fromfile(str(ROOT / config))


def _is_seg(cfg) -> bool:
    return cfg.get('default_scope', 'mmdet') == 'mmseg'


def _published_count(text: str) -> float:
    m = re.fullmatch(r'(\d+(?:\.\d+)?)([MG])', str(text))
    assert m, f'expected a published count such as 48M or 267G, got {text!r}'
    return float(m.group(1)) * (1e6 if m.group(2) == 'M' else 1e9)


def _metrics(results) -> dict[str, float]:
    return {k: v for r in results or [] for k, v in r['Metrics'].items()}


# ---------------------------------------------------------------- index, metafiles, coverage

def test_index_imports_every_metafile_once():
    index = yaml.safe_load((ROOT / 'model-index.yml').read_text())
    imports = index['Import']
    assert len(imports) == len(set(imports)), imports
    assert sorted(imports) == sorted(p.relative_to(ROOT).as_posix() for p in CONFIGS.glob('*/metafile.yml'))
    assert set(index) == {'Import'}
    # what `mim search mmplugin` reads: the package's link to the same file
    assert index_file().resolve() == (ROOT / 'model-index.yml').resolve()


def test_every_config_is_in_the_zoo():
    configs = {p.relative_to(ROOT).as_posix() for p in ZOO_CONFIGS}  # _base_/, demo/, deploy/ excluded
    listed = {m['Config'] for m in _models()}
    assert listed - configs == set(), 'metafile entries whose config does not exist'
    assert configs - listed == set(), 'configs missing from their folder\'s metafile.yml'
    assert len(configs) > 30


def test_collections_have_the_required_fields():
    for meta in sorted(CONFIGS.glob('*/metafile.yml')):
        content = yaml.safe_load(meta.read_text())
        assert set(content) == {'Collections', 'Models'}, meta
        for coll in content['Collections']:
            for key in ('Name', 'Metadata', 'Paper', 'README', 'Code'):
                assert coll.get(key), f'{meta.name}: collection without {key}'
            for key in ('Training Data', 'Training Techniques', 'Architecture'):
                assert coll['Metadata'].get(key), f'{meta.name}: collection metadata without {key}'
            assert re.fullmatch(r'https://arxiv\.org/abs/\d{4}\.\d{5}', coll['Paper']['URL']) and coll['Paper']['Title']
            assert (ROOT / coll['README']).is_file() and (ROOT / coll['Code']['URL']).is_file()
            assert coll['Code']['Version'] == mmplugin.__version__


def test_models_have_the_required_fields():
    basenames = {}
    for m in _models():
        where = f"{Path(m['Metafile']).name}: {m['Name']}"
        assert m['Name'] == m['Name'].strip() and ' ' not in m['Name'], where
        assert m['Name'].startswith(Path(m['Config']).stem), f'{where}: the name starts with its config name'
        md = m['Metadata']
        for key in ('Training Data', 'Pretrain', 'Batch Size', 'Architecture'):
            assert md.get(key), f'{where}: Metadata without {key}'
        assert ('Epochs' in md) != ('Iterations' in md), f'{where}: Epochs or Iterations'
        if 'Weights' in m:
            assert re.fullmatch(r'https://[\w./-]+\.pth', m['Weights']), where
            basename = m['Weights'].rsplit('/', 1)[1]  # the download cache is keyed by file name
            assert basename not in basenames, f'{where} and {basenames.get(basename)} share {basename}'
            basenames[basename] = m['Name']
            assert m.get('Results') and 'No Weights' not in m and 'Paper Results' not in m, where
            src = m['Source']
            assert src['Repository'] in AT_COMMIT | set(AT_RELEASE) and src['File'], where
            if src['Repository'] in AT_COMMIT:
                assert re.fullmatch(r'[0-9a-f]{40}', src['Commit']) and src['Config'].endswith('.py'), where
            else:
                assert src['Version'] and src['Name'], where
            if 'Training log' in m:
                assert re.fullmatch(r'https://[\w./-]+\.log\.json', m['Training log']), where
        else:
            assert 'Results' not in m and 'Source' not in m, f'{where}: results without a checkpoint'
            assert isinstance(m.get('No Weights'), str) and m['No Weights'], f'{where}: say why there is none'
        for field in ('Results', 'Paper Results'):
            for r in m.get(field) or []:
                assert r['Task'] in TASKS and r['Dataset'] in ('COCO', 'ADE20K'), where
                assert r['Metrics'] and set(r['Metrics']) <= TASKS[r['Task']], where
                assert all(isinstance(v, float) and 0 < v < 100 for v in r['Metrics'].values()), where
                assert (field == 'Paper Results') == ('Source' in r), f'{where}: paper numbers name their source'


def test_no_swin_v2_or_swiftformer_checkpoint_is_claimed():
    # neither was published: microsoft/Swin-Transformer#240 (Swin V2 detection / segmentation), Amshaker/SwiftFormer#10
    for m in _models():
        if m['Collection']['Name'] in ('Swin Transformer V2', 'SwiftFormer'):
            assert 'Weights' not in m and 'Results' not in m, m['Name']


# ---------------------------------------------------------------- against the configs and upstream metafiles

def test_metadata_matches_the_config():
    for m in _models():
        cfg = _cfg(m['Config'])
        md, seg = m['Metadata'], _is_seg(cfg)
        if seg:
            assert md['Iterations'] == cfg.train_cfg.max_iters, m['Name']
        else:
            assert md['Epochs'] == cfg.train_cfg.max_epochs, m['Name']
        assert md['Batch Size'] == 8 * cfg.train_dataloader.batch_size, f"{m['Name']}: 8 GPUs x the per-GPU batch"
        dataset = 'ADE20K' if seg else 'COCO'
        assert md['Training Data'] == dataset, m['Name']  # one string, as `mim search --dataset` matches it
        head = cfg.model.decode_head.type if seg else cfg.model.type
        assert METHODS[head] in md['Architecture'], (m['Name'], head)
        tasks = {r['Task'] for r in (m.get('Results') or []) + (m.get('Paper Results') or [])}
        assert all(r['Dataset'] == dataset for r in (m.get('Results') or []) + (m.get('Paper Results') or []))
        if 'Weights' in m:
            has_mask = 'mask_head' in cfg.model.get('roi_head', {})
            want = {'Semantic Segmentation'} if seg else (
                {'Object Detection', 'Instance Segmentation'} if has_mask else {'Object Detection'})
            assert tasks == want, m['Name']


def _upstream_metafile(package: str) -> tuple[str, dict[str, dict]]:
    """The installed package's version and its own Swin metafile's models by name."""
    mod = __import__(package)
    meta = Path(mod.__file__).parent / '.mim' / 'configs' / 'swin' / ('metafile.yml' if package == 'mmdet' else
                                                                        'metafile.yaml')
    return mod.__version__, {m['Name']: m for m in yaml.safe_load(meta.read_text())['Models']}


@pytest.mark.parametrize('repo', sorted(AT_RELEASE))
def test_openmmlab_entries_equal_the_installed_metafile(repo):
    version, upstream = _upstream_metafile(AT_RELEASE[repo])
    entries = [m for m in _models() if m.get('Source', {}).get('Repository') == repo]
    assert entries
    from mmplugin.utils.stack import installed_stack
    for m in entries:
        src = m['Source']
        if installed_stack() == 'openmmlab':  # the onedl forks ship the same entries under their own version
            assert src['Version'] == version, m['Name']
        up = upstream[src['Name']]
        if installed_stack() == 'openmmlab':
            assert m['Weights'] == up['Weights'], m['Name']
        else:  # the forks point at their mirror of the same files (mmassets.onedl.ai)
            assert Path(m['Weights']).name == Path(up['Weights']).name, m['Name']
        results = up['Results'] if isinstance(up['Results'], list) else [up['Results']]
        assert _metrics(m['Results']) == _metrics(results), m['Name']
        assert {r['Task'] for r in m['Results']} == {r['Task'] for r in results}, m['Name']
        for key, theirs in (('Epochs', 'Epochs'), ('Iterations', 'Iterations'), ('Batch Size', 'Batch Size'),
                            ('Training Memory (GB)', 'Training Memory (GB)'), ('Training Memory (GB)', 'Memory (GB)')):
            if theirs in up['Metadata']:
                assert m['Metadata'][key] == up['Metadata'][theirs], (m['Name'], key)
        if 'Training log' in up:
            assert Path(m['Training log']).name == Path(up['Training log']).name, m['Name']
            assert installed_stack() != 'openmmlab' or m['Training log'] == up['Training log'], m['Name']


def _build_on_meta(cfg):
    if _is_seg(cfg):
        from mmseg.registry import MODELS
        from mmseg.utils import register_all_modules
    else:
        from mmdet.registry import MODELS
        from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=True)
    model_cfg = cfg.model.copy()
    model_cfg.backbone.init_cfg = None
    with torch.device('meta'):
        return MODELS.build(model_cfg)


def test_every_config_builds_and_published_parameter_counts_hold():
    """One build per config (on ``meta``: shapes only). Where the official repositories or the Swin paper publish
    the architecture's parameter count (``Parameters``, rounded to millions), the built model has it."""
    counts = {}
    for m in _models():
        if m['Config'] not in counts:
            counts[m['Config']] = sum(p.numel() for p in _build_on_meta(_cfg(m['Config'])).parameters())
        n = counts[m['Config']]
        assert n > 1e6, m['Name']
        if 'Parameters' in m['Metadata']:
            published = _published_count(m['Metadata']['Parameters'])
            assert abs(n - published) <= 0.5e6, \
                f"{m['Name']}: {n / 1e6:.2f}M built, {m['Metadata']['Parameters']} published"
        if 'FLOPs' in m['Metadata']:
            _published_count(m['Metadata']['FLOPs'])
    assert len(counts) == len(ZOO_CONFIGS)


# ---------------------------------------------------------------- the Markdown tables

def _number(cell: str) -> float | None:
    return None if cell in ('-', '') else float(cell)


def _check_checkpoint_table(rows, where):
    assert rows, f'{where}: the "{CHECKPOINT_HEADING}" table is empty'
    by_name = {}
    for row in rows:
        name = row['model'].strip('`')
        assert name not in by_name, f'{where}: {name} twice'
        by_name[name] = row
    with_weights = {m['Name']: m for m in _models() if 'Weights' in m}
    assert set(by_name) == set(with_weights), f'{where}: rows differ from the metafiles\' checkpoints'
    for name, row in by_name.items():
        m = with_weights[name]
        got = {key: _number(row[col]) for key, col in (('box AP', 'box AP'), ('mask AP', 'mask AP'),
                                                       ('mIoU', 'mIoU'), ('mIoU(ms+flip)', 'mIoU (ms+flip)'))}
        assert {k: v for k, v in got.items() if v is not None} == _metrics(m['Results']), f'{where}: {name}'
        link = re.fullmatch(r'\[[^\]]+\]\((\S+)\)', row['checkpoint'])
        assert link and link.group(1) == m['Weights'], f'{where}: {name} links {row["checkpoint"]}'
        assert row['command'] == f"`python tools/test.py {m['Config']} {m['Weights']}`", f'{where}: {name}'


def test_docs_tables_match_the_metafiles():
    text = ZOO_DOC.read_text()
    _check_checkpoint_table(read_markdown_table(text, CHECKPOINT_HEADING), ZOO_DOC.name)
    rows = read_markdown_table(text, NO_CHECKPOINT_HEADING)
    without = {m['Config']: m for m in _models() if 'Weights' not in m}
    by_config = {r['config'].strip('`'): r for r in rows}
    assert len(by_config) == len(rows) and set(by_config) == set(without)
    for config, row in by_config.items():
        m = without[config]
        got = {k: _number(row[k]) for k in ('box AP', 'mask AP', 'mIoU')}
        assert {k: v for k, v in got.items() if v is not None} == _metrics(m.get('Paper Results')), config
        assert row['why no checkpoint'] == m['No Weights'], config


def test_readme_table_matches_the_metafiles():
    rows = read_markdown_table((ROOT / 'README.md').read_text(), CHECKPOINT_HEADING)
    if rows is None:
        pytest.skip(f'README.md has no "{CHECKPOINT_HEADING}" section')
    _check_checkpoint_table(rows, 'README.md')


def test_zoo_reader_refuses_broken_input(tmp_path):
    got = get_model('swin_t_maskrcnn_1x_coco', ROOT / 'model-index.yml')
    assert got['Config'] == 'configs/swin/swin_t_maskrcnn_1x_coco.py'
    with pytest.raises(KeyError, match='swin_t_maskrcnn_1x'):
        get_model('no_such_model', ROOT / 'model-index.yml')
    (tmp_path / 'model-index.yml').write_text('Import:\n  - missing.yml\n')
    with pytest.raises(ValueError, match='missing.yml'):
        load_models(tmp_path / 'model-index.yml')
    (tmp_path / 'a.yml').write_text('Collections: [{Name: A}]\nModels:\n  - {Name: x, In Collection: A}\n')
    (tmp_path / 'b.yml').write_text('Collections: [{Name: B}]\nModels:\n  - {Name: x, In Collection: B}\n')
    (tmp_path / 'model-index.yml').write_text('Import: [a.yml, b.yml]\n')
    with pytest.raises(ValueError, match="'x' appears in a.yml and b.yml"):
        load_models(tmp_path / 'model-index.yml')
    (tmp_path / 'model-index.yml').write_text('Import: [a.yml]\n')
    (tmp_path / 'a.yml').write_text('Collections: [{Name: A}]\nModels:\n  - {Name: x, In Collection: C}\n')
    with pytest.raises(ValueError, match='does not define'):
        load_models(tmp_path / 'model-index.yml')
    text = '## T\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n## U\n\nno table\n'
    assert read_markdown_table(text, 'T') == [{'a': '1', 'b': '2'}]
    assert read_markdown_table(text, 'V') is None
    with pytest.raises(ValueError, match='no Markdown table'):
        read_markdown_table(text, 'U')
    with pytest.raises(ValueError, match='3 cells'):
        read_markdown_table('# T\n| a | b |\n|---|---|\n| 1 | 2 | 3 |\n', 'T')
