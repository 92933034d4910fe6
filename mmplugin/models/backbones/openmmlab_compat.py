"""Keyword arguments of mmdet's, mmseg's and mmpretrain's ``SwinTransformer`` (and mmpretrain's V2), read with the
meaning they have in their home library, so an existing config works after swapping only the ``type``.

:func:`translate_swin_kwargs` turns them into the plugin's arguments or, for values the plugin cannot honour,
raises ONE :class:`UnsupportedArgumentsError` that lists every such key of the call, which library's meaning was
assumed and what to write instead. Nothing is silently ignored. docs/configuring.md ("Coming from mmdet / mmseg /
mmpretrain: keywords") lists the same keys.
"""
from __future__ import annotations

import inspect
import warnings

__all__ = ['UnsupportedArgumentsError', 'translate_swin_kwargs', 'resolve_pretrained', 'DEFAULT_ARCH']


class UnsupportedArgumentsError(ValueError, TypeError):
    """Arguments a plugin backbone cannot honour (a ValueError and a TypeError, so either ``except`` catches it)."""


class _Default(str):
    """The ``arch`` default: a str that remembers it was not given, so ``embed_dims`` etc. may define the arch."""


DEFAULT_ARCH = _Default('tiny')

# mmdet 3.3 / mmseg 1.2 SwinTransformer defaults for the arch keys (equal to Swin-T)
_MMDET_ARCH_DEFAULTS = dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])
_RESNET_ALIASES = ('open-mmlab://', 'torchvision://', 'mmcls://', 'mmpretrain://', 'modelzoo://')


def _fmt(value) -> str:
    return repr(value) if not isinstance(value, dict) else 'dict(' + ', '.join(
        f'{k}={v!r}' for k, v in value.items()) + ')'


def translate_swin_kwargs(cls, arch, kwargs: dict) -> tuple[object, dict]:
    """Map mmdet / mmseg / mmpretrain Swin keywords onto ``cls``'s own; returns ``(arch, kwargs)``.

    Args:
        cls: ``SwinTransformer`` or ``SwinTransformerV2`` (its public name goes into messages).
        arch: the ``arch`` argument as given (``DEFAULT_ARCH`` when omitted).
        kwargs: every other keyword argument of the call.

    Raises:
        UnsupportedArgumentsError: listing every argument that cannot be honoured or is unknown.
    """
    owner = cls.public_name()
    v2 = cls.v2
    kw = dict(kwargs)
    problems: list[str] = []

    # ---- mmpretrain V2 arch dicts carry extra_norm_every_n_blocks (0 for every released arch)
    if isinstance(arch, dict) and 'extra_norm_every_n_blocks' in arch:
        arch = dict(arch)
        every = arch.pop('extra_norm_every_n_blocks')
        if not v2 or every != 0:
            problems.append(f'arch extra_norm_every_n_blocks={every!r} [mmpretrain V2 meaning: a LayerNorm every n '
                            'blocks, used by the huge / giant archs]: only 0 (no extra norms) on Swin V2')

    # ---- embed_dims / depths / num_heads (mmdet, mmseg) define the arch
    arch_keys = [k for k in ('embed_dims', 'depths', 'num_heads') if k in kw]
    if arch_keys:
        given = {k: kw.pop(k) for k in arch_keys}
        given = {k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}
        if isinstance(arch, _Default):
            arch = {**_MMDET_ARCH_DEFAULTS, **given}
        else:
            try:
                settings = cls.resolve_arch(arch)
            except (ValueError, TypeError) as err:
                settings = None
                problems.append(f'arch={arch!r}: {err}')
            if settings is not None:
                clash = {k: v for k, v in given.items() if settings.get(k) != v}
                if clash:
                    problems.append(
                        f'{", ".join(f"{k}={v!r}" for k, v in clash.items())} disagree with arch={arch!r} '
                        f'({", ".join(f"{k}={settings[k]!r}" for k in clash)}) [mmdet/mmseg meaning]; give either '
                        'arch or embed_dims/depths/num_heads')

    patch_size = kw.get('patch_size', 4)
    if 'strides' in kw:  # mmdet / mmseg: patch-embedding stride, then one 2x patch merging per further stage
        strides = kw.pop('strides')
        depths = arch.get('depths') if isinstance(arch, dict) else None
        n = len(depths) if isinstance(depths, (list, tuple)) and depths else 4
        got = list(strides) if isinstance(strides, (list, tuple)) else strides
        want = [patch_size] + [2] * (n - 1)
        if got != want:
            problems.append(f'strides={strides!r} [mmdet/mmseg meaning: patch-embedding stride, then 2x merges]: '
                            f'only {tuple(want)} is Swin with {n} stages (len(depths)); set patch_size for the '
                            'first stride')
    if 'convert_weights' in kw:  # mmdet: convert official keys on load; the plugin detects every layout itself
        if not isinstance(kw.pop('convert_weights'), bool):
            problems.append('convert_weights must be a bool (checkpoints of every layout are converted '
                            'automatically; the argument can be dropped)')
    use_abs = kw.pop('use_abs_pos_embed', False)
    if use_abs is not False:
        problems.append(f'use_abs_pos_embed={use_abs!r} [mmdet/mmseg/mmpretrain meaning]: the plugin has no absolute '
                        'position embedding (no released Swin detection or segmentation model uses one); remove it')
    for key in ('pretrain_img_size', 'img_size'):  # only sizes the absolute position embedding
        if key in kw:
            size = kw.pop(key)
            ok = isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) in (1, 2)
                                           and all(isinstance(s, int) for s in size))
            if not ok or isinstance(size, bool):
                problems.append(f'{key}={size!r}: an int, (S, ) or (H, W) (it only sizes an absolute position '
                                'embedding, which Swin detection / segmentation does not use)')
    if 'interpolate_mode' in kw:  # mmpretrain: resizing of the absolute position embedding
        mode = kw.pop('interpolate_mode')
        if mode not in ('bicubic', 'bilinear', 'nearest'):
            problems.append(f'interpolate_mode={mode!r} [mmpretrain meaning]: one of bicubic / bilinear / nearest')
    if kw.pop('out_after_downsample', False) is not False:
        problems.append('out_after_downsample=True [mmpretrain meaning: return each stage after its patch merging] '
                        'is not supported: outputs are taken before the merge (strides 4/8/16/32, as mmdet); '
                        'remove it')
    stage_cfgs = kw.pop('stage_cfgs', None)
    allowed_stage = [None, {}] + ([dict(downsample_cfg=dict(is_post_norm=True))] if v2 else [])
    if stage_cfgs not in allowed_stage:
        problems.append(f'stage_cfgs={_fmt(stage_cfgs)} [mmpretrain meaning]: per-stage overrides are not supported'
                        + ('; Swin V2 already uses post-norm patch merging' if v2 else '') + '; remove it')
    patch_cfg = kw.pop('patch_cfg', None)
    if patch_cfg not in (None, {}):
        problems.append(f'patch_cfg={_fmt(patch_cfg)} [mmpretrain meaning]: overrides of the patch embedding are not '
                        'supported (use patch_size / in_channels / patch_norm); remove it')
    if 'pretrained_window_sizes' in kw:  # mmpretrain V2
        pws = kw.pop('pretrained_window_sizes')
        if not v2:
            problems.append('pretrained_window_sizes is a Swin V2 argument [mmpretrain]; use '
                            'mmplugin.SwinTransformerV2')
        elif 'pretrained_window_size' in kw:
            problems.append('give pretrained_window_sizes [mmpretrain] or pretrained_window_size, not both')
        else:
            kw['pretrained_window_size'] = list(pws) if isinstance(pws, tuple) else pws
    if 'norm_cfg' in kw or 'act_cfg' in kw:
        from .swin import swin_norm_act_problems
        problems += swin_norm_act_problems(kw.get('norm_cfg'), kw.get('act_cfg'))[1]
    if v2 and kw.get('qk_scale') is not None:
        problems.append(f'qk_scale={kw.pop("qk_scale")!r} [mmdet/mmseg meaning: attention scale]: Swin V2 uses '
                        'cosine attention with a learned per-head scale; remove it')

    # ---- unknown keys
    valid = set(inspect.signature(cls.__init__).parameters) | set(
        inspect.signature(cls.__mro__[1].__init__).parameters)
    valid -= {'self', 'kwargs'}
    unknown = [k for k in kw if k not in valid]
    for k in unknown:
        problems.append(f'{k}: unknown argument of {owner} (and of mmdet / mmseg / mmpretrain Swin)')
    if problems:
        raise UnsupportedArgumentsError(
            f'{owner} cannot honour {len(problems)} argument(s):\n  - ' + '\n  - '.join(problems) +
            f'\nValid arguments: {", ".join(sorted(valid))}, plus the mmdet / mmseg / mmpretrain Swin keywords listed '
            'in docs/configuring.md ("Coming from mmdet / mmseg / mmpretrain: keywords").')
    return arch, kw


def resolve_pretrained(owner: str, pretrained, init_cfg):
    """The deprecated OpenMMLab ``pretrained=`` argument, read as mmdet / mmseg do; returns the ``init_cfg`` to use.

    * a path or URL: ``init_cfg=dict(type='Pretrained', checkpoint=pretrained)`` (with mmdet's deprecation warning);
    * a ResNet model-zoo alias (``open-mmlab://``, ``torchvision://``, ...), which an mmseg / mmdet base config's
      ``model.pretrained`` hands to every backbone: ignored, with one warning that says so;
    * ``None``: nothing.
    """
    if pretrained is None:
        return init_cfg
    if not isinstance(pretrained, str):
        raise TypeError(f'{owner}: pretrained must be a str (path or URL) or None, got {type(pretrained).__name__}')
    if pretrained.startswith(_RESNET_ALIASES):
        warnings.warn(f'{owner}: ignoring pretrained={pretrained!r}, a model-zoo alias for another backbone. It '
                      'usually comes from a base config\'s model.pretrained (e.g. mmseg\'s _base_/models/*.py); set '
                      'model.pretrained=None to silence this, and give this backbone\'s weights with '
                      'init_cfg=dict(type=\'Pretrained\', checkpoint=...).', UserWarning, stacklevel=3)
        return init_cfg
    if init_cfg is not None:
        raise ValueError(f'{owner}: init_cfg and pretrained cannot be set at the same time (pretrained is '
                         'deprecated: use init_cfg=dict(type=\'Pretrained\', checkpoint=...))')
    warnings.warn('DeprecationWarning: pretrained is deprecated, please use "init_cfg" instead', UserWarning,
                  stacklevel=3)
    return dict(type='Pretrained', checkpoint=pretrained)
