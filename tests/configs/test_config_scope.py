"""``_base_ = ['mmplugin::...']`` from a project outside the repository (source checkout / editable
install; the wheel is covered by tests/package/test_packaging.py), the two ways around "mmplugin is not imported
before the config is read", and a step of training through tools/train.py with such a config."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mmengine.config import Config

import mmplugin

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
NUM_CLASSES = 3
CLASSES = ('circle', 'rectangle', 'triangle')  # mmplugin.demo.synthetic.CLASSES

# A user's project: inherits the plugin's config and changes only the number of classes (and names them).
USER_CONFIG = f"""
_base_ = ['mmplugin::swin/swin_t_maskrcnn_1x_coco.py']
metainfo = dict(classes={CLASSES!r})
train_dataloader = dict(dataset=dict(metainfo=metainfo))
model = dict(roi_head=dict(bbox_head=dict(num_classes={NUM_CLASSES}), mask_head=dict(num_classes={NUM_CLASSES})))
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def _plain(cfg: Config) -> dict:
    return json.loads(json.dumps(cfg.to_dict(), default=repr))


@pytest.fixture()
def user_config(tmp_path) -> Path:
    return _write(tmp_path / 'my_project' / 'configs' / 'my_swin_maskrcnn.py', USER_CONFIG)


def test_user_config_outside_the_repository_inherits_the_plugin_config(user_config):
    assert ROOT not in user_config.parents
    cfg = _plain(Config.fromfile(str(user_config)))
    ref = _plain(Config.fromfile(str(ROOT / 'configs' / 'swin/swin_t_maskrcnn_1x_coco.py')))
    # everything but the user's change equals the plugin config read from the repository
    for head in ('bbox_head', 'mask_head'):
        assert ref['model']['roi_head'][head]['num_classes'] == 80
        assert cfg['model']['roi_head'][head].pop('num_classes') == NUM_CLASSES
        ref['model']['roi_head'][head].pop('num_classes')
    assert cfg['train_dataloader']['dataset'].pop('metainfo') == {'classes': list(CLASSES)}
    assert cfg.pop('metainfo') == {'classes': list(CLASSES)}
    assert cfg == ref
    # no registry scope is forced on the inherited dicts: mmdet's models must stay visible to the builders
    assert cfg['model'].get('_scope_') != 'mmplugin' and cfg['default_scope'] == 'mmdet'


def test_nested_bases_and_mixed_prefixes(tmp_path):
    path = _write(tmp_path / 'cfg.py', """
        _base_ = ['mmplugin::_base_/swin_maskrcnn.py']
        model = dict(backbone=dict(arch='small'))
    """)
    cfg = Config.fromfile(str(path))
    assert cfg.model.backbone.type == 'mmplugin.SwinTransformer' and cfg.model.backbone.arch == 'small'
    assert cfg.model.type == 'MaskRCNN'  # from mmdet::_base_/models/mask-rcnn_r50_fpn.py: other prefixes still work
    assert mmplugin.config_file('mmplugin::_base_/swin_maskrcnn.py') == \
        (ROOT / 'configs' / '_base_' / 'swin_maskrcnn.py').resolve()


def test_the_user_config_builds_a_detector_with_its_classes(user_config):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = Config.fromfile(str(user_config))
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model)
    assert type(model.backbone).__module__.startswith('mmplugin.')
    assert model.roi_head.bbox_head.fc_cls.out_features == NUM_CLASSES + 1  # + background
    assert model.roi_head.mask_head.conv_logits.out_channels == NUM_CLASSES


def test_installing_the_prefix_twice_changes_nothing():
    before = Config.__dict__['_get_cfg_path']
    mmplugin.install_config_scope()
    assert Config.__dict__['_get_cfg_path'] is before
    assert Config._get_cfg_path('mmplugin::swin/swin_t_maskrcnn_1x_coco.py', '/any/cfg.py') == \
        (str((ROOT / 'configs' / 'swin/swin_t_maskrcnn_1x_coco.py').resolve()), None)  # no registry scope


@pytest.mark.parametrize('name, error, words', [
    ('mmplugin::no_such_config.py', FileNotFoundError,
     ['no_such_config.py', 'swin/swin_t_maskrcnn_1x_coco.py', '_base_']),
    ('mmplugin::../pyproject.toml', ValueError, ['outside the plugin configs']),
])
def test_bad_plugin_config_names_are_reported(tmp_path, name, error, words):
    path = _write(tmp_path / 'cfg.py', f'_base_ = [{name!r}]\n')
    with pytest.raises(error) as info:
        Config.fromfile(str(path))
    for word in words:
        assert word in str(info.value)


def _run(args, cwd, env=None, timeout=600):
    """Run outside the repository; PYTHONPATH makes ``import mmplugin`` mean this checkout even where the
    environment's editable install points at another one."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get('PYTHONPATH')]))
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, 'PYTHONPATH': path, **(env or {})})


def test_without_importing_mmplugin_first(tmp_path, user_config):
    """mmengine reads ``_base_`` before ``custom_imports``: the README's two ways for launchers that do not import
    mmplugin (wrap the launcher with runpy; or an environment variable holding the plugin's config folder)."""
    launcher = _write(tmp_path / 'third_party_train.py', """
        import json, sys
        from mmengine.config import Config
        cfg = Config.fromfile(sys.argv[1])
        print(json.dumps(cfg.model.roi_head.bbox_head.num_classes))
    """)
    env_config = _write(tmp_path / 'env_cfg.py', USER_CONFIG.replace(
        "'mmplugin::swin/swin_t_maskrcnn_1x_coco.py'", "'{{$MMPLUGIN_CONFIGS:}}/swin_t_maskrcnn_1x.py'"))
    # the plain launcher cannot know the prefix (mmengine's own error)
    out = _run([PY, str(launcher), str(user_config)], cwd=tmp_path)
    assert out.returncode != 0
    assert 'does not support to load mmplugin' in out.stderr or '_get_package_and_cfg_path' in out.stderr, \
        out.stderr[-2000:]
    # 1. wrap it (README one-liner)
    wrap = ('import mmplugin, runpy, sys; sys.argv = sys.argv[1:]; '
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    out = _run([PY, '-c', wrap, str(launcher), str(user_config)], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == NUM_CLASSES
    # 2. environment variable, set from the README's command
    out = _run([PY, '-c', 'import mmplugin; print(mmplugin.config_root())'], cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    root = out.stdout.strip().splitlines()[-1]
    assert Path(root).resolve() == (ROOT / 'configs').resolve()
    out = _run([PY, str(launcher), str(env_config)], cwd=tmp_path, env={'MMPLUGIN_CONFIGS': root})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == NUM_CLASSES


@pytest.mark.slow
def test_user_config_trains_a_step_through_tools_train(tmp_path, user_config):
    from mmplugin.demo import make_instance_dataset
    data = tmp_path / 'shapes_coco'
    make_instance_dataset(str(data), num_train=2, num_val=1, size=64, seed=3)
    # test-only shrinking of the user's config: 64 px images, one iteration, no validation, no checkpoint file
    tiny = _write(user_config.parent / 'tiny_run.py', f"""
        _base_ = ['./my_swin_maskrcnn.py']
        model = dict(backbone=dict(init_cfg=None))  # no outside weights in tests
        train_dataloader = dict(
            batch_size=1, num_workers=0, persistent_workers=False,
            sampler=dict(type='InfiniteSampler', shuffle=False), batch_sampler=None,
            dataset=dict(data_root='{data}/', ann_file='annotations/instances_train.json',
                         data_prefix=dict(img='train/'),
                         pipeline=[dict(type='LoadImageFromFile'),
                                   dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
                                   dict(type='Resize', scale=(64, 64), keep_ratio=True),
                                   dict(type='PackDetInputs')]))
        train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=1, val_interval=1000)
        val_cfg = None
        val_dataloader = None
        val_evaluator = None
        param_scheduler = []
        default_hooks = dict(logger=dict(interval=1), checkpoint=None)
        log_processor = dict(by_epoch=False)
    """)
    work = tmp_path / 'work'
    out = _run([PY, str(ROOT / 'tools' / 'train.py'), str(tiny), '--work-dir', str(work)], cwd=tmp_path,
               timeout=900)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    losses = [float(v) for v in re.findall(r'Iter\(train\) \[1/1\].*?\sloss: ([\d.]+)', log)]
    assert len(losses) == 1 and 0 < losses[0] < 100, log[-3000:]
    dumped = Config.fromfile(str(work / 'tiny_run.py'))  # the config the runner used
    assert dumped.model.backbone.type == 'mmplugin.SwinTransformer'
    assert dumped.model.roi_head.bbox_head.num_classes == NUM_CLASSES
    assert dumped.model.roi_head.mask_head.num_classes == NUM_CLASSES
    assert not list(work.glob('*.pth'))


def test_mmseg_bases_resolve_without_the_original_distribution(monkeypatch):
    """The maintained forks install the ``mmseg`` package as ``onedl-mmsegmentation``: mmengine's lookup of the
    ``mmseg::`` scope by the distribution name ``mmsegmentation`` fails there ("mmsegmentation is not installed").
    The plugin then finds the bases through the importable package; the config equals the one loaded normally."""
    import mmengine.config.config as mm_config
    from mmengine.config import Config

    from mmplugin import config_file
    path = str(config_file('swin/swin_t_upernet_160k_ade20k.py'))
    want = Config.fromfile(path).to_dict()
    real = mm_config.is_installed
    monkeypatch.setattr(mm_config, 'is_installed', lambda pkg: pkg != 'mmsegmentation' and real(pkg))
    assert Config.fromfile(path).to_dict() == want
