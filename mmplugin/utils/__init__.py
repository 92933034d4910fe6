"""Helpers for the command-line tools."""
from .datasets import DatasetMissingError, check_datasets
from .runner import find_resumable_checkpoint, prepare_runner_cfg

__all__ = ['DatasetMissingError', 'check_datasets', 'find_resumable_checkpoint', 'prepare_runner_cfg']
