"""The table of mmdet / mmseg / mmpretrain Swin keywords (``SWIN_KEYWORDS``) against the documented table ("keyword
(library) | honoured | refused"), row by row in both directions, and every rule against the backbones' behaviour:
an honoured value builds, a refused one raises an error that names the keyword."""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from mmplugin.models import SwinTransformer, SwinTransformerV2
from mmplugin.models.backbones.swin.keywords import ALL_LIBRARIES, ARCH_NOT_GIVEN, SWIN_KEYWORDS, translate_swin_kwargs

ROOT = Path(__file__).resolve().parents[3]
HEADER = '| keyword (library) | honoured | refused |'
LIBRARIES = {'mmdet', 'mmseg', 'mmpretrain', 'plugin'}
SMALL = dict(embed_dims=32, depths=[2, 2, 2, 2], num_heads=[1, 2, 4, 8])

# keyword -> (class, honoured call, refused call or None); a call is (arch, keyword arguments)
EXAMPLES = {
    'arch': (SwinTransformer, (SMALL, {}), ('xxs', {})),
    'embed_dims': (SwinTransformer, (ARCH_NOT_GIVEN, dict(embed_dims=32, num_heads=[1, 2, 4, 8])),
                   ('tiny', dict(embed_dims=128))),
    'depths': (SwinTransformer, (ARCH_NOT_GIVEN, dict(SMALL)), ('tiny', dict(depths=[2, 2, 2, 2]))),
    'num_heads': (SwinTransformer, (SMALL, dict(num_heads=[1, 2, 4, 8])), (SMALL, dict(num_heads=[1, 1, 1, 1]))),
    'strides': (SwinTransformer, (SMALL, dict(strides=(4, 2, 2, 2))), (SMALL, dict(strides=(4, 2, 2, 1)))),
    'convert_weights': (SwinTransformer, (SMALL, dict(convert_weights=True)), (SMALL, dict(convert_weights='yes'))),
    'use_abs_pos_embed': (SwinTransformer, (SMALL, dict(use_abs_pos_embed=False)),
                          (SMALL, dict(use_abs_pos_embed=True))),
    'pretrain_img_size': (SwinTransformer, (SMALL, dict(pretrain_img_size=384)),
                          (SMALL, dict(pretrain_img_size=(1, 2, 3)))),
    'img_size': (SwinTransformer, (SMALL, dict(img_size=(256, 256))), (SMALL, dict(img_size='big'))),
    'interpolate_mode': (SwinTransformer, (SMALL, dict(interpolate_mode='bicubic')),
                         (SMALL, dict(interpolate_mode='area'))),
    'out_after_downsample': (SwinTransformer, (SMALL, dict(out_after_downsample=False)),
                             (SMALL, dict(out_after_downsample=True))),
    'stage_cfgs': (SwinTransformerV2, (SMALL, dict(stage_cfgs=dict(downsample_cfg=dict(is_post_norm=True)))),
                   (SMALL, dict(stage_cfgs=dict(block_cfgs=dict(window_size=4))))),
    'patch_cfg': (SwinTransformer, (SMALL, dict(patch_cfg={})), (SMALL, dict(patch_cfg=dict(kernel_size=3)))),
    'pretrained_window_sizes': (SwinTransformerV2, (SMALL, dict(pretrained_window_sizes=[6, 6, 6, 4])), None),
    'norm_cfg': (SwinTransformer, (SMALL, dict(norm_cfg=dict(type='LN', requires_grad=False))),
                 (SMALL, dict(norm_cfg=dict(type='BN')))),
    'act_cfg': (SwinTransformer, (SMALL, dict(act_cfg=dict(type='GELU'))), (SMALL, dict(act_cfg=dict(type='ReLU')))),
    'qk_scale': (SwinTransformerV2, (SMALL, dict(qk_scale=None)), (SMALL, dict(qk_scale=0.5))),
    'patch_size': (SwinTransformer, (SMALL, dict(patch_size=2)), None),
    'window_size': (SwinTransformer, (SMALL, dict(window_size=5)), None),
    'mlp_ratio': (SwinTransformer, (SMALL, dict(mlp_ratio=2.0)), None),
    'qkv_bias': (SwinTransformer, (SMALL, dict(qkv_bias=False)), None),
    'drop_path_rate': (SwinTransformer, (SMALL, dict(drop_path_rate=0.2)), None),
    'out_indices': (SwinTransformer, (SMALL, dict(out_indices=(1, 2))), None),
    'with_cp': (SwinTransformer, (SMALL, dict(with_cp=True)), None),
    'in_channels': (SwinTransformer, (SMALL, dict(in_channels=1)), None),
    'init_cfg': (SwinTransformer, (SMALL, dict(init_cfg=None)), None),
    'patch_norm': (SwinTransformer, (SMALL, dict(patch_norm=False)), None),
    'drop_rate': (SwinTransformer, (SMALL, dict(drop_rate=0.1)), (SMALL, dict(drop_rate=1.5))),
    'attn_drop_rate': (SwinTransformer, (SMALL, dict(attn_drop_rate=0.1)), (SMALL, dict(attn_drop_rate=-0.1))),
    'pretrained': (SwinTransformer, (SMALL, dict(pretrained='open-mmlab://resnet50_v1c')),
                   (SMALL, dict(pretrained=3))),
    'pad_small_map': (SwinTransformer, (SMALL, dict(pad_small_map=False)), (SMALL, dict(pad_small_map='yes'))),
    'frozen_stages': (SwinTransformer, (SMALL, dict(frozen_stages=1)), None),
    'norm_eval': (SwinTransformer, (SMALL, dict(norm_eval=True)), None),
}
# refused on the other version: (class, call)
REFUSED_ELSEWHERE = {'pretrained_window_sizes': (SwinTransformer, (SMALL, dict(pretrained_window_sizes=[7] * 4)))}


def _documented_rows() -> list[tuple[dict[str, tuple[str, ...] | None], str, str]]:
    """The rows of the one documented keyword table (README.md or docs/*.md): ``({keyword: libraries or None},
    honoured, refused)``; libraries are None where the row names none."""
    tables = []
    for path in [ROOT / 'README.md', *sorted((ROOT / 'docs').glob('*.md'))]:
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == HEADER:
                rows = []
                for row in lines[i + 2:]:
                    if not row.startswith('|'):
                        break
                    rows.append([cell.strip() for cell in row.strip().strip('|').split('|')])
                tables.append((path, rows))
    assert len(tables) == 1, f'expected one keyword table {HEADER!r}, found {[str(p) for p, _ in tables]}'
    out = []
    for cells in tables[0][1]:
        assert len(cells) == 3, cells
        keywords: dict[str, tuple[str, ...] | None] = {}
        pending: list[str] = []
        for name, libs in re.findall(r'`([^`]+)`|\(([^)]*)\)', cells[0]):
            if name:
                pending.append(name)
            else:
                named = tuple(sorted(w for w in re.findall(r'[a-z]+', libs) if w in LIBRARIES))
                keywords.update(dict.fromkeys(pending, named))
                pending = []
        keywords.update(dict.fromkeys(pending, None))
        out.append((keywords, cells[1], cells[2]))
    return out


RULES = {k: rule for rule in SWIN_KEYWORDS for k in rule.keywords}


def test_every_keyword_has_one_rule():
    names = [k for rule in SWIN_KEYWORDS for k in rule.keywords]
    assert len(names) == len(set(names)), [k for k in names if names.count(k) > 1]
    for rule in SWIN_KEYWORDS:
        assert rule.action in ('same', 'translate', 'check'), rule
        assert set(rule.libraries) <= LIBRARIES, rule
        assert (rule.handler is None) <= (rule.action == 'same'), rule


def test_documented_table_equals_the_rules():
    rows = _documented_rows()
    documented = [k for keywords, _, _ in rows for k in keywords]
    assert len(documented) == len(set(documented)), 'a keyword is in several rows'
    assert sorted(set(documented) - set(RULES)) == [], 'documented keywords without a rule'
    assert sorted(set(RULES) - set(documented)) == [], 'rules missing from the documented table'
    for keywords, _, refused in rows:
        for k, libs in keywords.items():
            rule = RULES[k]
            want = tuple(sorted(ALL_LIBRARIES)) if libs is None else libs
            assert tuple(sorted(rule.libraries)) == want, (k, rule.libraries, libs)
            assert (rule.refused is None) == refused.startswith('-'), (k, rule.refused, refused)


def test_same_keywords_are_the_plugin_arguments():
    for cls in (SwinTransformer, SwinTransformerV2):
        plugin = set(cls.plugin_arguments())
        for k, rule in RULES.items():
            assert (k in plugin) == (rule.action == 'same'), (cls.__name__, k, rule.action)


def test_examples_cover_every_rule():
    assert sorted(EXAMPLES) == sorted(RULES)
    for k, (_, _, refused) in EXAMPLES.items():
        assert (refused is None and k not in REFUSED_ELSEWHERE) == (RULES[k].refused is None), k


def _build(cls, call):
    arch, kwargs = call
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # pretrained= aliases warn by design
        if arch is ARCH_NOT_GIVEN:
            return cls(**kwargs)
        return cls(arch, **kwargs)


@pytest.mark.parametrize('keyword', sorted(EXAMPLES))
def test_rule_behaviour(keyword):
    cls, honoured, refused = EXAMPLES[keyword]
    _build(cls, honoured)
    for cls_, call in ([(cls, refused)] if refused else []) + ([REFUSED_ELSEWHERE[keyword]]
                                                              if keyword in REFUSED_ELSEWHERE else []):
        with pytest.raises((ValueError, TypeError)) as info:
            _build(cls_, call)
        assert keyword in str(info.value), str(info.value)


def test_arch_not_given():
    assert translate_swin_kwargs(SwinTransformer, ARCH_NOT_GIVEN, {}) == ('tiny', {})
    arch, kw = translate_swin_kwargs(SwinTransformer, ARCH_NOT_GIVEN, dict(depths=(2, 2, 2, 2), with_cp=True))
    assert arch == dict(embed_dims=96, depths=[2, 2, 2, 2], num_heads=[3, 6, 12, 24]) and kw == dict(with_cp=True)
    assert SwinTransformer(embed_dims=32, num_heads=[1, 2, 4, 8]).arch_name == 'custom'
    assert SwinTransformer.default_arch() == SwinTransformerV2.default_arch() == 'tiny'
