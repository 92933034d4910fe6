"""Synthetic datasets for the embedded demo (no downloads)."""
from mmplugin.demo.synthetic import CLASSES, make_instance_dataset, make_semantic_dataset

__all__ = ['CLASSES', 'make_instance_dataset', 'make_semantic_dataset']
