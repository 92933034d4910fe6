"""Drawing of every test prediction of an mmseg segmentor into a folder (tools/test.py --show-dir)."""
from __future__ import annotations

import os
import os.path as osp

from mmseg.engine.hooks import SegVisualizationHook

from mmplugin.registry import HOOKS

__all__ = ['SegTestVisualizationHook']


@HOOKS.register_module()
class SegTestVisualizationHook(SegVisualizationHook):
    """mmseg 1.2's ``SegVisualizationHook`` for the test loop, writing ``out_dir/<image name>`` for every image.

    mmseg's hook has no output folder (its drawings go through the visualizer's storage backends), draws only every
    ``interval``-th batch, and labels each drawing with ``runner.iter``, which builds the training dataloader: a
    test-only machine without the training images fails there. This one draws every test image, labels it with its
    running index and saves it as mmdet's ``DetVisualizationHook`` does with ``test_out_dir``.

    Args:
        out_dir (str): folder of the drawings (created).
        **kwargs: ``SegVisualizationHook``'s (``draw`` defaults to True here).
    """

    def __init__(self, out_dir: str, draw: bool = True, **kwargs):
        super().__init__(draw=draw, **kwargs)
        self.out_dir = out_dir
        self._test_index = 0

    def after_test_iter(self, runner, batch_idx, data_batch, outputs) -> None:
        if self.draw is False:
            return
        import mmcv
        from mmengine import fileio
        os.makedirs(self.out_dir, exist_ok=True)
        for output in outputs:
            self._test_index += 1
            name = osp.basename(output.img_path)
            img = mmcv.imfrombytes(fileio.get(output.img_path, backend_args=self.backend_args), channel_order='rgb')
            self._visualizer.add_datasample(f'test_{name}', img, data_sample=output, show=self.show,
                                            wait_time=self.wait_time, step=self._test_index,
                                            out_file=osp.join(self.out_dir, osp.splitext(name)[0] + '.png'))
