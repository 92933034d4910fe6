"""Helpers for the command-line tools."""
from .datasets import (DatasetClassesError, DatasetConfigError, DatasetMissingError, annotation_categories,
                       check_datasets)
from .runner import find_resumable_checkpoint, prepare_runner_cfg

__all__ = ['DatasetClassesError', 'DatasetConfigError', 'DatasetMissingError', 'annotation_categories',
           'check_datasets', 'find_resumable_checkpoint', 'prepare_runner_cfg']
