"""Pictures, loss curves and the closing summary of ``tools/demo.sh``.

Pure functions on arrays, dicts and files (no model code), so the tests exercise them on synthetic inputs:

* :func:`draw_instances` / :func:`draw_label_map` draw instances (masks, boxes, class and score) or a semantic label map
  in the class colours of the config's palette, at ``>= 384`` px;
* :func:`side_by_side` puts ground truth and prediction next to each other under a title row, with a legend strip;
* :func:`load_scalars` / :func:`plot_loss_curves` read mmengine's ``vis_data/scalars.json`` and plot the losses;
* :func:`latest_metrics`, :func:`per_class_iou` and :func:`summary_table` collect and print the figures.
"""
from __future__ import annotations

import glob
import json
import os
import os.path as osp
import re
from typing import Iterable, Sequence

import cv2
import numpy as np

MIN_SIDE = 384


def _upscale(img: np.ndarray, side: int, nearest: bool = False) -> tuple[np.ndarray, float]:
    h, w = img.shape[:2]
    scale = max(1.0, side / min(h, w))
    if scale == 1.0:
        return img.copy(), 1.0
    size = (int(round(w * scale)), int(round(h * scale)))
    return cv2.resize(img, size, interpolation=cv2.INTER_NEAREST if nearest else cv2.INTER_LINEAR), scale


def _text(img: np.ndarray, text: str, org: tuple[int, int], colour, scale: float = 0.5, box: bool = True) -> None:
    """Text on a filled box of ``colour`` (white or black letters, whichever reads better)."""
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    x, y = int(org[0]), int(max(org[1], th + base))
    fg = (0, 0, 0) if sum(colour) > 382 else (255, 255, 255)
    if box:
        cv2.rectangle(img, (x, y - th - base), (x + tw + 4, y + 1), tuple(int(c) for c in colour), -1)
    else:
        fg = tuple(int(c) for c in colour)
    cv2.putText(img, text, (x + 2, y - base + 1), cv2.FONT_HERSHEY_SIMPLEX, scale, fg, 1, cv2.LINE_AA)


def draw_instances(img: np.ndarray, boxes: np.ndarray, labels: Sequence[int], classes: Sequence[str],
                   palette: Sequence[Sequence[int]], masks: np.ndarray | None = None,
                   scores: Sequence[float] | None = None, score_thr: float = 0.5,
                   side: int = MIN_SIDE) -> np.ndarray:
    """Draw instances on an RGB image upscaled to ``side`` px: mask tint and outline, box, ``class score``.

    ``boxes`` are ``x1, y1, x2, y2`` in the image's pixels; with ``scores``, instances below ``score_thr`` are not
    drawn. Returns a new RGB image.
    """
    out, scale = _upscale(img, side)
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    keep = np.ones(len(boxes), bool) if scores is None else np.asarray(scores) >= score_thr
    for i in np.flatnonzero(keep):
        colour = np.asarray(palette[int(labels[i])], np.float32)
        if masks is not None:
            m = cv2.resize(np.asarray(masks[i], np.uint8), out.shape[1::-1], interpolation=cv2.INTER_NEAREST) > 0
            out[m] = (0.5 * out[m] + 0.5 * colour).astype(np.uint8)
            contours, _ = cv2.findContours(m.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
            cv2.drawContours(out, contours, -1, tuple(int(c) for c in colour), 2)
        x1, y1, x2, y2 = (boxes[i] * scale).round().astype(int)
        cv2.rectangle(out, (x1, y1), (x2, y2), tuple(int(c) for c in colour), 2)
        label = classes[int(labels[i])] + ('' if scores is None else f' {float(scores[i]):.2f}')
        _text(out, label, (x1, y1), colour)
    return out


def draw_label_map(img: np.ndarray, label: np.ndarray, palette: Sequence[Sequence[int]], alpha: float = 0.8,
                   side: int = MIN_SIDE, skip: Iterable[int] = (0, )) -> np.ndarray:
    """Tint an RGB image with a semantic label map (class ``k`` in ``palette[k]``; ``skip`` classes untinted)."""
    out, _ = _upscale(img, side)
    lab, _ = _upscale(np.asarray(label, np.uint8), side, nearest=True)
    skip = set(skip)
    for k, colour in enumerate(palette):
        if k in skip:
            continue
        m = lab == k
        out[m] = ((1 - alpha) * out[m] + alpha * np.asarray(colour, np.float32)).astype(np.uint8)
    return out


def legend(classes: Sequence[str], palette: Sequence[Sequence[int]], width: int, height: int = 28) -> np.ndarray:
    """A white strip with one colour swatch and name per class."""
    strip = np.full((height, width, 3), 255, np.uint8)
    x = 8
    for name, colour in zip(classes, palette):
        cv2.rectangle(strip, (x, 6), (x + 16, height - 6), tuple(int(c) for c in colour), -1)
        cv2.rectangle(strip, (x, 6), (x + 16, height - 6), (0, 0, 0), 1)
        _text(strip, name, (x + 20, height - 8), (0, 0, 0), box=False)
        x += 20 + cv2.getTextSize(name, cv2.FONT_HERSHEY_SIMPLEX, 0.5, 1)[0][0] + 18
    return strip


def side_by_side(rows: Sequence[tuple[np.ndarray, np.ndarray]], classes: Sequence[str],
                 palette: Sequence[Sequence[int]], titles: tuple[str, str] = ('ground truth', 'prediction'),
                 gap: int = 6) -> np.ndarray:
    """Stack ``(ground truth, prediction)`` picture pairs as rows under a title row, with a legend below."""
    h = max(max(a.shape[0], b.shape[0]) for a, b in rows)
    w = max(a.shape[1] for a, _ in rows), max(b.shape[1] for _, b in rows)
    width = w[0] + w[1] + 3 * gap
    canvas = [np.full((26, width, 3), 255, np.uint8)]
    _text(canvas[0], titles[0], (gap, 20), (0, 0, 0), box=False)
    _text(canvas[0], titles[1], (2 * gap + w[0], 20), (0, 0, 0), box=False)
    for a, b in rows:
        row = np.full((h + gap, width, 3), 255, np.uint8)
        row[:a.shape[0], gap:gap + a.shape[1]] = a
        row[:b.shape[0], 2 * gap + w[0]:2 * gap + w[0] + b.shape[1]] = b
        canvas.append(row)
    canvas.append(legend(classes, palette, width))
    return np.concatenate(canvas, axis=0)


def save_rgb(path: str, img: np.ndarray) -> str:
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    if not cv2.imwrite(path, cv2.cvtColor(img, cv2.COLOR_RGB2BGR)):
        raise OSError(f'could not write {path}')
    return path


# ---------------------------------------------------------------------------------------------------- loss curves
def load_scalars(path: str) -> list[dict]:
    """mmengine's ``vis_data/scalars.json``: one JSON object per line (training lines have ``loss``)."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def find_scalars(work_dir: str) -> str:
    """The newest ``<work_dir>/<timestamp>/vis_data/scalars.json``."""
    found = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    if not found:
        raise FileNotFoundError(f'no */vis_data/scalars.json under {work_dir}')
    return found[-1]


def plot_loss_curves(curves: dict[str, str], out: str) -> str:
    """One panel per run (title -> scalars.json): every ``loss*`` key against the iteration. Writes a PNG."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4), squeeze=False)
    for ax, (title, path) in zip(axes[0], curves.items()):
        rows = [r for r in load_scalars(path) if 'loss' in r and 'step' in r]
        keys = sorted({k for r in rows for k in r if k.startswith('loss') or '.loss' in k})
        if not rows:
            raise ValueError(f'{path} has no training losses')
        for k in keys:
            pts = [(r['step'], r[k]) for r in rows if k in r]
            ax.plot(*zip(*pts), label=k, lw=2 if k == 'loss' else 1)
        ax.set_title(title)
        ax.set_xlabel('iteration')
        ax.set_yscale('log')
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(osp.dirname(osp.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


# ------------------------------------------------------------------------------------------------------ figures
def latest_metrics(work_dir: str) -> dict:
    """The metrics ``tools/test.py`` logged: the last line of the newest ``<work_dir>/<timestamp>/<timestamp>.json``."""
    found = sorted(p for p in glob.glob(osp.join(work_dir, '*', '*.json')) if 'vis_data' not in p)
    found += sorted(glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))
    for path in reversed(found):
        with open(path) as f:
            lines = [json.loads(x) for x in f if x.strip()]
        if lines:
            return lines[-1]
    raise FileNotFoundError(f'no metrics json under {work_dir}')


_ROW = re.compile(r'^\|\s*([^|]+?)\s*\|\s*([0-9.]+|nan)\s*\|\s*([0-9.]+|nan)\s*\|\s*$')


def per_class_iou(log_text: str) -> dict[str, float]:
    """mmseg's per-class table (``| class | IoU | Acc |``) from a log; the last table wins."""
    out: dict[str, float] = {}
    for line in log_text.splitlines():
        line = line.split(' - mmengine - INFO - ')[-1].strip()
        if line.startswith('+') or 'Class' in line:
            if 'Class' in line:
                out = {}
            continue
        m = _ROW.match(line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def fmt_seconds(s: float) -> str:
    s = int(round(s))
    return f'{s // 60} min {s % 60:02d} s'


def summary_table(rows: Sequence[tuple[str, str]], title: str = 'demo summary') -> str:
    """A two-column plain-text table."""
    w = max([len(k) for k, _ in rows] + [len(title)])
    v = max([len(str(x)) for _, x in rows] + [8])
    line = '+' + '-' * (w + 2) + '+' + '-' * (v + 2) + '+'
    out = [line, f'| {title:<{w + v + 3}} |', line]
    out += [f'| {k:<{w}} | {str(x):<{v}} |' for k, x in rows]
    out.append(line)
    return '\n'.join(out)
