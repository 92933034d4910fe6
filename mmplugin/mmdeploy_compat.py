"""Compatibility name: the mmdeploy integration lives in :mod:`mmplugin.deploy.mmdeploy`."""
from .deploy.mmdeploy import TESTED_MMDEPLOY, end2end_parity, export_end2end, patch_mmdeploy_for_torch2

__all__ = ['TESTED_MMDEPLOY', 'patch_mmdeploy_for_torch2', 'export_end2end', 'end2end_parity']
