"""Keyword arguments of mmdet's, mmseg's and mmpretrain's ``SwinTransformer`` (and mmpretrain's V2), read with the
meaning they have in their home library, so an existing config works after swapping only the ``type``.

:data:`SWIN_KEYWORDS` is the table: one :class:`KeywordRule` per keyword (the three arch keywords, which define one
arch together, share a rule), saying which libraries give the keyword that meaning, what the plugin does with it
(the plugin argument of the same meaning, a translation, or a check) and which values it refuses.
:func:`translate_swin_kwargs` applies the rules in table order and raises ONE :class:`UnsupportedArgumentsError`
that lists every key of the call the plugin cannot honour, which library's meaning was assumed and what to write
instead. Nothing is silently ignored. docs/configuring.md ("Coming from mmdet / mmseg / mmpretrain: keywords")
shows the same table; ``tests/models/backbones/test_swin_keywords.py`` checks the two against each other row by row.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from mmplugin.models.backbones.arguments import UnsupportedArgumentsError

__all__ = [
    'ARCH_NOT_GIVEN', 'KeywordRule', 'SWIN_KEYWORDS', 'UnsupportedArgumentsError', 'act_cfg_problems',
    'norm_cfg_problems', 'swin_norm_act_problems', 'translate_swin_kwargs'
]

#: the libraries whose Swin backbones take a keyword when a rule names none in particular
ALL_LIBRARIES = ('mmdet', 'mmseg', 'mmpretrain')


class _ArchNotGiven:
    """Type of :data:`ARCH_NOT_GIVEN`: the ``arch`` default of the Swin classes, so that mmdet's ``embed_dims`` /
    ``depths`` / ``num_heads`` may define the arch when ``arch`` itself was not given."""

    __slots__ = ()

    def __repr__(self) -> str:
        return 'ARCH_NOT_GIVEN'


ARCH_NOT_GIVEN = _ArchNotGiven()
#: the arch of a call that gives neither ``arch`` nor any of ``embed_dims`` / ``depths`` / ``num_heads``
FALLBACK_ARCH = 'tiny'

# mmdet 3.3 / mmseg 1.2 SwinTransformer defaults for the arch keys (equal to Swin-T)
_MMDET_ARCH_DEFAULTS = dict(embed_dims=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24])


def _fmt(value) -> str:
    return repr(value) if not isinstance(value, dict) else 'dict(' + ', '.join(
        f'{k}={v!r}' for k, v in value.items()) + ')'


@dataclass
class _Call:
    """One constructor call being translated: the target class, ``arch`` and the keywords not yet consumed."""

    cls: type
    arch: object
    kw: dict
    problems: list[str] = field(default_factory=list)

    @property
    def v2(self) -> bool:
        return bool(self.cls.v2)


@dataclass(frozen=True)
class KeywordRule:
    """How one keyword of another library's Swin backbone is read.

    Attributes:
        keywords: the keyword (the arch rule has three, read together).
        libraries: where the keyword has the meaning the rule reads (``'mmdet'``, ``'mmseg'``, ``'mmpretrain'``,
            ``'plugin'``).
        action: ``'same'``: the plugin argument of the same name and meaning, passed on (the constructor checks
            its value); ``'translate'``: turned into the plugin's arguments; ``'check'``: its value is checked and,
            where the plugin has no counterpart, dropped, as it has no effect on a Swin without absolute position
            embedding or when every checkpoint layout is converted anyway.
        refused: the values the plugin refuses, in words; None: every value of the home library is honoured.
        handler: ``handler(call)`` consumes the keyword from ``call.kw`` (or leaves it for the constructor) and
            appends to ``call.problems``; None for ``'same'``.
    """

    keywords: tuple[str, ...]
    libraries: tuple[str, ...]
    action: str
    refused: str | None
    handler: Callable[[_Call], None] | None = None


# ---------------------------------------------------------------------------------------------------- handlers
def _arch_dict(call: _Call) -> None:
    """mmpretrain V2 arch dicts carry ``extra_norm_every_n_blocks`` (0 for every released arch)."""
    if isinstance(call.arch, dict) and 'extra_norm_every_n_blocks' in call.arch:
        call.arch = dict(call.arch)
        every = call.arch.pop('extra_norm_every_n_blocks')
        if not call.v2 or every != 0:
            call.problems.append(f'arch extra_norm_every_n_blocks={every!r} [mmpretrain V2 meaning: a LayerNorm every '
                                 'n blocks, used by the huge / giant archs]: only 0 (no extra norms) on Swin V2')


def _arch_parts(call: _Call) -> None:
    """``embed_dims`` / ``depths`` / ``num_heads`` (mmdet, mmseg) define the arch, or must agree with ``arch``."""
    kw = call.kw
    arch_keys = [k for k in ('embed_dims', 'depths', 'num_heads') if k in kw]
    if arch_keys:
        given = {k: kw.pop(k) for k in arch_keys}
        given = {k: list(v) if isinstance(v, tuple) else v for k, v in given.items()}
        if call.arch is ARCH_NOT_GIVEN:
            call.arch = {**_MMDET_ARCH_DEFAULTS, **given}
        else:
            try:
                settings = call.cls.resolve_arch(call.arch)
            except (ValueError, TypeError) as err:
                settings = None
                call.problems.append(f'arch={call.arch!r}: {err}')
            if settings is not None:
                clash = {k: v for k, v in given.items() if settings.get(k) != v}
                if clash:
                    call.problems.append(
                        f'{", ".join(f"{k}={v!r}" for k, v in clash.items())} disagree with arch={call.arch!r} '
                        f'({", ".join(f"{k}={settings[k]!r}" for k in clash)}) [mmdet/mmseg meaning]; give either '
                        'arch or embed_dims/depths/num_heads')
    if call.arch is ARCH_NOT_GIVEN:
        call.arch = FALLBACK_ARCH


def _strides(call: _Call) -> None:
    """mmdet / mmseg: patch-embedding stride, then one 2x patch merging per further stage."""
    if 'strides' in call.kw:
        strides = call.kw.pop('strides')
        patch_size = call.kw.get('patch_size', 4)
        depths = call.arch.get('depths') if isinstance(call.arch, dict) else None
        n = len(depths) if isinstance(depths, (list, tuple)) and depths else 4
        got = list(strides) if isinstance(strides, (list, tuple)) else strides
        want = [patch_size] + [2] * (n - 1)
        if got != want:
            call.problems.append(f'strides={strides!r} [mmdet/mmseg meaning: patch-embedding stride, then 2x merges]: '
                                 f'only {tuple(want)} is Swin with {n} stages (len(depths)); set patch_size for the '
                                 'first stride')


def _convert_weights(call: _Call) -> None:
    """mmdet: convert official keys on load; the plugin detects every layout itself."""
    if 'convert_weights' in call.kw and not isinstance(call.kw.pop('convert_weights'), bool):
        call.problems.append('convert_weights must be a bool (checkpoints of every layout are converted '
                             'automatically; the argument can be dropped)')


def _use_abs_pos_embed(call: _Call) -> None:
    use_abs = call.kw.pop('use_abs_pos_embed', False)
    if use_abs is not False:
        call.problems.append(f'use_abs_pos_embed={use_abs!r} [mmdet/mmseg/mmpretrain meaning]: the plugin has no '
                             'absolute position embedding (no released Swin detection or segmentation model uses '
                             'one); remove it')


def _image_size(call: _Call, key: str) -> None:
    """``pretrain_img_size`` / ``img_size`` only size the absolute position embedding."""
    if key in call.kw:
        size = call.kw.pop(key)
        ok = isinstance(size, int) or (isinstance(size, (list, tuple)) and len(size) in (1, 2)
                                       and all(isinstance(s, int) for s in size))
        if not ok or isinstance(size, bool):
            call.problems.append(f'{key}={size!r}: an int, (S, ) or (H, W) (it only sizes an absolute position '
                                 'embedding, which Swin detection / segmentation does not use)')


def _interpolate_mode(call: _Call) -> None:
    """mmpretrain: resizing of the absolute position embedding."""
    if 'interpolate_mode' in call.kw:
        mode = call.kw.pop('interpolate_mode')
        if mode not in ('bicubic', 'bilinear', 'nearest'):
            call.problems.append(f'interpolate_mode={mode!r} [mmpretrain meaning]: one of bicubic / bilinear / '
                                 'nearest')


def _out_after_downsample(call: _Call) -> None:
    if call.kw.pop('out_after_downsample', False) is not False:
        call.problems.append('out_after_downsample=True [mmpretrain meaning: return each stage after its patch '
                             'merging] is not supported: outputs are taken before the merge (strides 4/8/16/32, as '
                             'mmdet); remove it')


def _stage_cfgs(call: _Call) -> None:
    stage_cfgs = call.kw.pop('stage_cfgs', None)
    allowed = [None, {}] + ([dict(downsample_cfg=dict(is_post_norm=True))] if call.v2 else [])
    if stage_cfgs not in allowed:
        call.problems.append(f'stage_cfgs={_fmt(stage_cfgs)} [mmpretrain meaning]: per-stage overrides are not '
                             'supported' + ('; Swin V2 already uses post-norm patch merging' if call.v2 else '')
                             + '; remove it')


def _patch_cfg(call: _Call) -> None:
    patch_cfg = call.kw.pop('patch_cfg', None)
    if patch_cfg not in (None, {}):
        call.problems.append(f'patch_cfg={_fmt(patch_cfg)} [mmpretrain meaning]: overrides of the patch embedding '
                             'are not supported (use patch_size / in_channels / patch_norm); remove it')


def _pretrained_window_sizes(call: _Call) -> None:
    """mmpretrain V2's spelling of the plugin's ``pretrained_window_size``."""
    kw = call.kw
    if 'pretrained_window_sizes' in kw:
        pws = kw.pop('pretrained_window_sizes')
        if not call.v2:
            call.problems.append('pretrained_window_sizes is a Swin V2 argument [mmpretrain]; use '
                                 'mmplugin.SwinTransformerV2')
        elif 'pretrained_window_size' in kw:
            call.problems.append('give pretrained_window_sizes [mmpretrain] or pretrained_window_size, not both')
        else:
            kw['pretrained_window_size'] = list(pws) if isinstance(pws, tuple) else pws


def norm_cfg_problems(norm_cfg: dict | None) -> tuple[bool, list[str]]:
    """An OpenMMLab ``norm_cfg`` of a Swin backbone: ``(requires_grad of the norms, problems)``. Only what Swin is
    defined with can be honoured: LayerNorm (eps 1e-5)."""
    problems = []
    norm = dict(norm_cfg or {})
    requires_grad = norm.pop('requires_grad', True)
    if norm.pop('type', 'LN') not in ('LN', 'LayerNorm') or norm.pop('eps', 1e-5) != 1e-5 or norm:
        problems.append(f'norm_cfg={norm_cfg!r}: only LayerNorm, dict(type=\'LN\'[, requires_grad=...])')
    if not isinstance(requires_grad, bool):
        problems.append(f'norm_cfg requires_grad={requires_grad!r}: a bool')
    return requires_grad is not False, problems


def act_cfg_problems(act_cfg: dict | None) -> list[str]:
    """The problems of an OpenMMLab ``act_cfg`` of a Swin backbone: only GELU (exact) can be honoured."""
    act = dict(act_cfg or {})
    if act.pop('type', 'GELU') != 'GELU' or act.pop('approximate', 'none') != 'none' or act:
        return [f'act_cfg={act_cfg!r}: only dict(type=\'GELU\')']
    return []


def swin_norm_act_problems(norm_cfg: dict | None, act_cfg: dict | None) -> tuple[bool, list[str]]:
    """``norm_cfg`` and ``act_cfg`` together: ``(requires_grad of the norms, problems)``."""
    requires_grad, problems = norm_cfg_problems(norm_cfg)
    return requires_grad, problems + act_cfg_problems(act_cfg)


def _norm_cfg(call: _Call) -> None:
    """Checked here so its problems join the others; left in the keywords for the constructor to apply."""
    if 'norm_cfg' in call.kw:
        call.problems += norm_cfg_problems(call.kw['norm_cfg'])[1]


def _act_cfg(call: _Call) -> None:
    if 'act_cfg' in call.kw:
        call.problems += act_cfg_problems(call.kw['act_cfg'])


def _qk_scale(call: _Call) -> None:
    if call.v2 and call.kw.get('qk_scale') is not None:
        call.problems.append(f'qk_scale={call.kw.pop("qk_scale")!r} [mmdet/mmseg meaning: attention scale]: Swin V2 '
                             'uses cosine attention with a learned per-head scale; remove it')


# ---------------------------------------------------------------------------------------------------- the table
def _same(*keywords: str, libraries: tuple[str, ...] = ALL_LIBRARIES, refused: str | None = None) -> KeywordRule:
    return KeywordRule(keywords, libraries, 'same', refused)


#: applied in this order (the order of the messages of the one error)
SWIN_KEYWORDS: tuple[KeywordRule, ...] = (
    KeywordRule(('arch', ), ('mmpretrain', 'plugin'), 'same', 'other names; dicts with other keys', _arch_dict),
    KeywordRule(('embed_dims', 'depths', 'num_heads'), ('mmdet', 'mmseg'), 'translate',
                'values that disagree with an explicit arch', _arch_parts),
    KeywordRule(('strides', ), ('mmdet', 'mmseg'), 'check', 'anything but (patch_size, 2, ..., 2)', _strides),
    KeywordRule(('convert_weights', ), ('mmdet', ), 'check', 'non-bool', _convert_weights),
    KeywordRule(('use_abs_pos_embed', ), ALL_LIBRARIES, 'check', 'True', _use_abs_pos_embed),
    KeywordRule(('pretrain_img_size', ), ('mmdet', 'mmseg'), 'check', 'malformed sizes',
                partial(_image_size, key='pretrain_img_size')),
    KeywordRule(('img_size', ), ('mmpretrain', ), 'check', 'malformed sizes', partial(_image_size, key='img_size')),
    KeywordRule(('interpolate_mode', ), ('mmpretrain', ), 'check', 'unknown modes', _interpolate_mode),
    KeywordRule(('out_after_downsample', ), ('mmpretrain', ), 'check', 'True', _out_after_downsample),
    KeywordRule(('stage_cfgs', ), ('mmpretrain', ), 'check', 'overrides', _stage_cfgs),
    KeywordRule(('patch_cfg', ), ('mmpretrain', ), 'check', 'overrides', _patch_cfg),
    KeywordRule(('pretrained_window_sizes', ), ('mmpretrain', ), 'translate', 'on V1', _pretrained_window_sizes),
    KeywordRule(('norm_cfg', ), ALL_LIBRARIES, 'same', 'other norms', _norm_cfg),
    KeywordRule(('act_cfg', ), ALL_LIBRARIES, 'same', 'other activations', _act_cfg),
    KeywordRule(('qk_scale', ), ('mmdet', 'mmseg'), 'same', 'a number on V2', _qk_scale),
    _same('patch_size', 'window_size', 'mlp_ratio', 'qkv_bias', 'drop_path_rate', 'out_indices', 'with_cp',
          'in_channels', 'init_cfg'),
    _same('patch_norm', libraries=('mmdet', 'mmseg')),
    _same('drop_rate', 'attn_drop_rate', refused='values outside [0, 1)'),
    _same('pretrained', libraries=('mmdet', 'mmseg'), refused='together with init_cfg; non-str'),
    _same('pad_small_map', libraries=('mmpretrain', ), refused='values other than None / True / False'),
    _same('frozen_stages', 'norm_eval'),
)


def translate_swin_kwargs(cls, arch, kwargs: dict) -> tuple[object, dict]:
    """Map mmdet / mmseg / mmpretrain Swin keywords onto ``cls``'s own; returns ``(arch, kwargs)``.

    Args:
        cls: ``SwinTransformer`` or ``SwinTransformerV2``: its public name goes into messages, its
            ``plugin_arguments()`` are the keywords it takes as they are.
        arch: the ``arch`` argument as given (:data:`ARCH_NOT_GIVEN` when omitted; then the arch keywords define
            it, or it is ``'tiny'``).
        kwargs: every other keyword argument of the call.

    Raises:
        UnsupportedArgumentsError: listing every argument that cannot be honoured or is unknown.
    """
    owner = cls.public_name()
    call = _Call(cls, arch, dict(kwargs))
    for rule in SWIN_KEYWORDS:
        if rule.handler is not None:
            rule.handler(call)
    valid = set(cls.plugin_arguments())
    for k in call.kw:
        if k not in valid:
            call.problems.append(f'{k}: unknown argument of {owner} (and of mmdet / mmseg / mmpretrain Swin)')
    if call.problems:
        raise UnsupportedArgumentsError(
            f'{owner} cannot honour {len(call.problems)} argument(s):\n  - ' + '\n  - '.join(call.problems) +
            f'\nValid arguments: {", ".join(sorted(valid))}, plus the mmdet / mmseg / mmpretrain Swin keywords listed '
            'in docs/configuring.md ("Coming from mmdet / mmseg / mmpretrain: keywords").')
    return call.arch, call.kw
