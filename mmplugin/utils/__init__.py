"""Helpers for the command-line tools."""
from .datasets import DatasetMissingError, check_datasets
from .runner import build_runner, find_resumable_checkpoint, prepare_runner_cfg

__all__ = ['DatasetMissingError', 'build_runner', 'check_datasets', 'find_resumable_checkpoint', 'prepare_runner_cfg']
