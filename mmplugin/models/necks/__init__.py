"""Necks registered under the ``mmplugin`` scope."""
from .global_attention import GlobalAttentionBlock, GlobalAttentionNeck, GlobalSelfAttention

__all__ = ['GlobalAttentionBlock', 'GlobalAttentionNeck', 'GlobalSelfAttention']
