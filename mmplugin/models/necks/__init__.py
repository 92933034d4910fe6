"""Necks registered under the ``mmplugin`` scope."""
from mmplugin.models.necks.global_attention import GlobalAttentionBlock, GlobalAttentionNeck, GlobalSelfAttention

__all__ = ['GlobalAttentionBlock', 'GlobalAttentionNeck', 'GlobalSelfAttention']
