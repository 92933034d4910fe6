"""Predictions of tools/infer.py as files: drawings, and machine-readable predictions.

* Detectors: the per-image dict of mmdet's ``DetInferencer`` (``pred2dict``): ``bboxes`` (x1, y1, x2, y2 in input
  image pixels), ``labels`` (0-based class indices), ``scores`` and, for instance segmentation, ``masks`` as COCO
  compressed RLE (``size`` [H, W], ``counts`` a str: ``pycocotools.mask.decode`` reads it), all predictions
  without a score threshold, plus ``img_path``.
* Segmentors: the label map (0-based class indices of the config's ``classes``; uint8, uint16 past 255 classes) as a
  PNG, and ``img_path`` / ``sem_seg_path`` in the json.

The json file is ``{"classes": [...], "predictions": [one dict per image, in input order]}``, the layout of
``DetInferencer``'s ``pred_out_file`` plus the class names.
"""
from __future__ import annotations

import json
import os
import os.path as osp

import numpy as np

from mmplugin.utils.errors import UserError

__all__ = ['IMAGE_EXTENSIONS', 'PredictionOutputError', 'list_images', 'check_drawing_path', 'det_pred_to_dict',
           'seg_label_map_path', 'check_distinct_outputs', 'write_label_map', 'InferenceWriter']

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


class PredictionOutputError(UserError, ValueError):
    """An input or output path tools/infer.py cannot use; the message says what to give instead."""


def list_images(path: str) -> list[str]:
    """``[path]`` for a file; the images of a folder (by extension, sorted, not recursive) for a folder."""
    if osp.isfile(path):
        _check_readable(path)
        return [path]
    if not osp.isdir(path):
        raise PredictionOutputError(f'image file or folder not found: {path}')
    images = sorted(osp.join(path, n) for n in os.listdir(path) if n.lower().endswith(IMAGE_EXTENSIONS))
    if not images:
        raise PredictionOutputError(f'no images ({", ".join(IMAGE_EXTENSIONS)}) in {path}')
    for image in images:
        _check_readable(image)
    stems = [osp.splitext(osp.basename(p))[0] for p in images]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise PredictionOutputError(f'{path} holds images of the same name with different extensions ({dup}); '
                                    'their drawings and label maps would overwrite each other')
    return images


def _check_readable(path: str) -> None:
    """Refuse, before any model is built, a file OpenCV cannot decode (its header names no image format it reads:
    a text file named ``x.jpg``, an empty or truncated download), instead of mmcv's "failed to load image"."""
    import cv2
    if os.path.getsize(path) == 0 or not cv2.haveImageReader(path):
        raise PredictionOutputError(f'{path} is not an image OpenCV can read (empty, truncated, or another format '
                                    'under an image name); give an image file or a folder of images')


def check_drawing_path(out: str) -> None:
    """Refuse a drawing file name OpenCV cannot encode (``x.json``: "could not find encoder") up front."""
    import cv2
    ext = osp.splitext(out)[1].lower()
    if ext in ('.json', '.pkl', '.txt'):
        raise PredictionOutputError(f'--out is the drawing, an image file (.png, .jpg), not {out!r}; '
                                    'for machine-readable predictions use --pred-out FILE.json')
    if not ext or not cv2.haveImageWriter(out):
        raise PredictionOutputError(f'--out {out!r}: OpenCV cannot write images of type {ext or "(none)"!r}; '
                                    'give a .png or .jpg file')


def det_pred_to_dict(data_sample) -> dict:
    """A ``DetDataSample``'s predictions as json-ready lists, keys and formats of mmdet's ``DetInferencer``."""
    from mmdet.structures.mask import encode_mask_results
    pred = data_sample.pred_instances.cpu().numpy()
    out = {'bboxes': pred.bboxes.tolist(), 'labels': pred.labels.tolist(), 'scores': pred.scores.tolist()}
    if 'masks' in pred:
        masks = encode_mask_results(pred.masks)
        for m in masks:
            if isinstance(m['counts'], bytes):
                m['counts'] = m['counts'].decode()
        out['masks'] = masks
    return out


def seg_label_map_path(pred_out: str, image: str, many: bool) -> str:
    """Where the label map of ``image`` goes: ``FILE_labels.png`` beside ``FILE.json`` for one image (a name no
    drawing gets by default: ``--out result.png --pred-out result.json`` keeps both), else
    ``FILE/<image name>.png`` (a folder beside the json)."""
    stem = osp.splitext(pred_out)[0]
    if not many:
        return stem + '_labels.png'
    return osp.join(stem, osp.splitext(osp.basename(image))[0] + '.png')


def check_distinct_outputs(out: str | None, pred_out: str | None, many: bool, segmentor: bool) -> None:
    """Refuse outputs that would overwrite one another: the drawing (file or folder), the json and, for a
    segmentor, its label map(s) must be different paths.

    Raises:
        PredictionOutputError: two of them are the same path (names both options and a fix).
    """
    if out is None or pred_out is None:
        return
    same = osp.abspath(out) == osp.abspath(pred_out)
    what = 'the json'
    if segmentor and not same:
        labels = osp.splitext(pred_out)[0] if many else seg_label_map_path(pred_out, '', many)
        same, what = osp.abspath(out) == osp.abspath(labels), f'the label maps ({labels})'
    if same:
        raise PredictionOutputError(f'--out {out!r} and --pred-out {pred_out!r}: the drawings would overwrite '
                                    f'{what}; give --out another name')


def write_label_map(label: np.ndarray, path: str) -> None:
    """Write an ``(H, W)`` integer label map losslessly as a PNG (uint8, or uint16 when a label exceeds 255)."""
    import cv2
    if label.min() < 0 or label.max() > 65535:
        raise ValueError(f'labels {label.min()}..{label.max()} do not fit a PNG label map')
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    if not cv2.imwrite(path, label.astype(np.uint8 if label.max() <= 255 else np.uint16)):
        raise OSError(f'could not write {path}')


class InferenceWriter:
    """Collects one image's prediction after another: draws it (``out``: a file for one image, a folder for many)
    and records it for ``pred_out`` (written by :meth:`close`).

    Args:
        model: the detector / segmentor (its ``dataset_meta`` names the classes and palette).
        segmentor: whether the model is an mmseg segmentor.
        out: drawing file (one image) or folder (many); ``None``: no drawings.
        pred_out: json file of the predictions, or ``None``.
        many: whether the input was a folder.
        score_thr: drawing threshold for detections (the json keeps every prediction).
    """

    def __init__(self, model, segmentor: bool, out: str | None, pred_out: str | None, many: bool,
                 score_thr: float = 0.3):
        self.model, self.segmentor, self.out, self.pred_out, self.many = model, segmentor, out, pred_out, many
        self.score_thr = score_thr
        self.records: list[dict] = []
        if pred_out is not None and not pred_out.endswith('.json'):
            raise PredictionOutputError(f'--pred-out writes json: give a .json file, not {pred_out!r}')
        if out is not None and not many:
            check_drawing_path(out)
        check_distinct_outputs(out, pred_out, many, segmentor)
        if out is not None and many and osp.splitext(out)[1].lower() in IMAGE_EXTENSIONS + ('.json', ):
            raise PredictionOutputError(f'with a folder of images --out names a folder for the drawings, '
                                        f'not {out!r}')
        self.visualizer = None
        if out is not None:
            if segmentor:
                from mmseg.visualization import SegLocalVisualizer
                self.visualizer = SegLocalVisualizer(name=f'mmplugin_infer_{id(self)}', alpha=0.6)
            else:
                from mmdet.visualization import DetLocalVisualizer
                self.visualizer = DetLocalVisualizer(name=f'mmplugin_infer_{id(self)}')
            self.visualizer.dataset_meta = model.dataset_meta

    def drawing_path(self, image: str) -> str:
        return osp.join(self.out, osp.splitext(osp.basename(image))[0] + '.png') if self.many else self.out

    def add(self, image: str, result) -> dict:
        """Record and draw one image's ``DetDataSample`` / ``SegDataSample``; returns its json record."""
        if self.segmentor:
            record = {'img_path': image}
            if self.pred_out is not None:
                label = result.pred_sem_seg.data.squeeze(0).cpu().numpy()
                path = seg_label_map_path(self.pred_out, image, self.many)
                write_label_map(label, path)
                record['sem_seg_path'] = path
        else:
            record = {'img_path': image, **det_pred_to_dict(result)}
        if self.visualizer is not None:
            import mmcv
            img = mmcv.imread(image, channel_order='rgb')
            target = self.drawing_path(image)
            os.makedirs(osp.dirname(osp.abspath(target)), exist_ok=True)
            kwargs = {} if self.segmentor else {'pred_score_thr': self.score_thr}
            self.visualizer.add_datasample('result', img, result, draw_gt=False, show=False, out_file=target,
                                           **kwargs)
        self.records.append(record)
        return record

    def close(self) -> str | None:
        """Write the json (if asked); returns its path."""
        if self.pred_out is None:
            return None
        os.makedirs(osp.dirname(osp.abspath(self.pred_out)), exist_ok=True)
        classes = list((self.model.dataset_meta or {}).get('classes') or [])
        with open(self.pred_out, 'w') as f:
            json.dump({'classes': classes, 'predictions': self.records}, f)
        return self.pred_out
