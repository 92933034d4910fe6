"""Registration: the plugin's backbones build through mmdet's and mmseg's registries, do not clash with their own
Swin, and ``custom_imports`` is all a config needs."""
from __future__ import annotations

import subprocess
import sys

import pytest

import mmplugin


@pytest.mark.parametrize('lib', ['mmdet', 'mmseg'])
@pytest.mark.parametrize('name,kwargs', [('SwiftFormer', dict(arch='xs')), ('SwinTransformer', dict(arch='tiny')),
                                         ('SwinTransformerV2', dict(arch='tiny'))])
def test_build_through_downstream_registries(lib, name, kwargs):
    registry = __import__(f'{lib}.registry', fromlist=['MODELS']).MODELS
    model = registry.build(dict(type=f'mmplugin.{name}', **kwargs))
    assert type(model) is getattr(mmplugin.models, name)
    assert type(model).__module__.startswith('mmplugin.')


def test_no_name_clash_with_downstream_swin():
    from mmdet.registry import MODELS as DET
    from mmseg.registry import MODELS as SEG
    det_cls, seg_cls = DET.get('SwinTransformer'), SEG.get('SwinTransformer')
    assert det_cls.__module__.startswith('mmdet.') and seg_cls.__module__.startswith('mmseg.')
    assert mmplugin.MODELS.scope == 'mmplugin'
    assert mmplugin.MODELS.get('SwinTransformer') is mmplugin.models.SwinTransformer


def test_custom_imports_is_all_a_config_needs(tmp_path):
    cfg_file = tmp_path / 'cfg.py'
    cfg_file.write_text("custom_imports = dict(imports=['mmplugin'], allow_failed_imports=False)\n"
                        "backbone = dict(type='mmplugin.SwiftFormer', arch='XS', out_indices=(1, 3))\n")
    code = ('from mmengine.config import Config; from mmdet.registry import MODELS; '
            f'cfg = Config.fromfile({str(cfg_file)!r}); m = MODELS.build(cfg.backbone); '
            'print(type(m).__module__, m.out_channels)')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert 'mmplugin.models.backbones.swiftformer.model [56, 220]' in out.stdout
