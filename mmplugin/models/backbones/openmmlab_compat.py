"""Former home of the OpenMMLab keyword handling, kept so that its imports keep working.

Swin's mmdet / mmseg / mmpretrain keywords: :mod:`.swin_keywords`; the deprecated ``pretrained=`` argument:
:mod:`.pretrained`; :class:`UnsupportedArgumentsError`: :mod:`.arguments`.
"""
from .arguments import UnsupportedArgumentsError
from .pretrained import resolve_pretrained
from .swin_keywords import ARCH_NOT_GIVEN, DEFAULT_ARCH, translate_swin_kwargs

__all__ = ['UnsupportedArgumentsError', 'translate_swin_kwargs', 'resolve_pretrained', 'DEFAULT_ARCH',
           'ARCH_NOT_GIVEN']
