"""Coloured shapes with exact masks on textured backgrounds, generated deterministically from a seed.

* :func:`make_instance_dataset` writes a COCO-format instance-segmentation set (``train/``, ``val/`` PNG images,
  ``annotations/instances_{train,val}.json`` with compressed-RLE masks);
* :func:`make_semantic_dataset` writes the same kind of images in ADE20K layout (``images/{training,validation}``,
  ``annotations/{training,validation}`` PNG label maps; 0 = background, 1..3 = the shape classes).

Shapes are told apart by geometry (colour is random), later shapes occlude earlier ones and masks account for it.
"""
from __future__ import annotations

import json
import os
import os.path as osp

import cv2
import numpy as np

CLASSES = ('circle', 'rectangle', 'triangle')


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """Smooth colour noise plus stripes: texture that a detector must learn to ignore."""
    low = rng.uniform(40, 200, size=(6, 6, 3)).astype(np.float32)
    img = cv2.resize(low, (size, size), interpolation=cv2.INTER_CUBIC)
    yy, xx = np.mgrid[0:size, 0:size]
    angle, period = rng.uniform(0, np.pi), rng.uniform(6, 20)
    stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)[..., None]
    img = img + stripes * rng.uniform(10, 30) + rng.normal(0, 6, size=(size, size, 3))
    return img


def _shape_mask(rng: np.random.Generator, cls: int, size: int) -> np.ndarray:
    mask = np.zeros((size, size), np.uint8)
    s = rng.uniform(0.16, 0.42) * size
    cx, cy = rng.uniform(s / 2, size - s / 2, size=2)
    if cls == 0:
        cv2.circle(mask, (int(cx), int(cy)), int(s / 2), 1, -1)
    elif cls == 1:
        w, h = s * rng.uniform(0.6, 1.0), s * rng.uniform(0.6, 1.0)
        box = cv2.boxPoints(((cx, cy), (w, h), rng.uniform(0, 90)))
        cv2.fillPoly(mask, [np.round(box).astype(np.int32)], 1)
    else:
        a0 = rng.uniform(0, 2 * np.pi)
        pts = [(cx + s / 2 * np.cos(a0 + k * 2 * np.pi / 3), cy + s / 2 * np.sin(a0 + k * 2 * np.pi / 3))
               for k in range(3)]
        cv2.fillPoly(mask, [np.round(np.array(pts)).astype(np.int32)], 1)
    return mask


def _sample(rng: np.random.Generator, size: int):
    """One image and its instances ``[(class, mask)]`` (masks already occluded by later shapes)."""
    img = _background(rng, size)
    instances = []
    for _ in range(int(rng.integers(1, 4))):
        cls = int(rng.integers(0, len(CLASSES)))
        mask = _shape_mask(rng, cls, size)
        color = rng.uniform(0, 255, size=3)
        img[mask.astype(bool)] = color + rng.normal(0, 4, size=(int(mask.sum()), 3))
        instances = [(c, m & (1 - mask)) for c, m in instances]
        instances.append((cls, mask))
    instances = [(c, m) for c, m in instances if m.sum() >= 30]
    return np.clip(img, 0, 255).astype(np.uint8), instances


def _rle(mask: np.ndarray) -> dict:
    from pycocotools import mask as mask_util
    rle = mask_util.encode(np.asfortranarray(mask))
    rle['counts'] = rle['counts'].decode('ascii')
    return rle


def make_instance_dataset(root: str, num_train: int = 400, num_val: int = 60, size: int = 192,
                          seed: int = 0) -> dict[str, str]:
    """Write the COCO-format set under ``root``; returns the annotation file paths."""
    from pycocotools import mask as mask_util
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (('train', num_train), ('val', num_val)):
        os.makedirs(osp.join(root, split), exist_ok=True)
        images, anns = [], []
        for i in range(n):
            img, instances = _sample(rng, size)
            name = f'{split}_{i:05d}.png'
            cv2.imwrite(osp.join(root, split, name), img)
            images.append(dict(id=i + 1, file_name=name, height=size, width=size))
            for cls, mask in instances:
                rle = _rle(mask)
                x, y, w, h = (float(v) for v in mask_util.toBbox(rle))
                anns.append(dict(id=len(anns) + 1, image_id=i + 1, category_id=cls + 1, segmentation=rle,
                                 area=float(mask.sum()), bbox=[x, y, w, h], iscrowd=0))
        coco = dict(images=images, annotations=anns,
                    categories=[dict(id=k + 1, name=c) for k, c in enumerate(CLASSES)])
        os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
        path = osp.join(root, 'annotations', f'instances_{split}.json')
        with open(path, 'w') as f:
            json.dump(coco, f)
        out[split] = path
    return out


def make_semantic_dataset(root: str, num_train: int = 300, num_val: int = 50, size: int = 160,
                          seed: int = 1) -> None:
    """Write the ADE20K-layout set under ``root``."""
    rng = np.random.default_rng(seed)
    for split, n in (('training', num_train), ('validation', num_val)):
        os.makedirs(osp.join(root, 'images', split), exist_ok=True)
        os.makedirs(osp.join(root, 'annotations', split), exist_ok=True)
        for i in range(n):
            img, instances = _sample(rng, size)
            label = np.zeros((size, size), np.uint8)
            for cls, mask in instances:
                label[mask.astype(bool)] = cls + 1
            cv2.imwrite(osp.join(root, 'images', split, f'{i:05d}.png'), img)
            cv2.imwrite(osp.join(root, 'annotations', split, f'{i:05d}.png'), label)
