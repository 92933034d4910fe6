"""mmcv's NMS and RoIAlign kernels, and their torchvision stand-ins (:func:`install_torchvision_kernels`), against a
reference written from the formulation (Mask R-CNN's RoIAlign: bilinear samples on a regular grid per bin, averaged;
greedy NMS by descending score).

The reference is checked against mmcv's own compiled kernels wherever mmcv has them (CI), and the torchvision
stand-ins against the reference wherever torchvision imports (the GPU check machine: torch and torchvision, no
compiled mmcv), so both meet the same formulation.
"""
from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from mmplugin.engine import mmcv_ops


def _has_mmcv_ext() -> bool:
    """mmcv's own compiled extension (not the torchvision stand-in) is importable."""
    import sys
    try:
        found = importlib.util.find_spec('mmcv._ext') is not None
    except ImportError:  # no mmcv at all
        return False
    return found and not isinstance(sys.modules.get('mmcv._ext'), mmcv_ops._TorchvisionExt)


HAS_MMCV_EXT = _has_mmcv_ext()
HAS_TORCHVISION = importlib.util.find_spec('torchvision') is not None


def roi_align_reference(x: torch.Tensor, rois: torch.Tensor, out_hw, scale: float, sampling: int,
                        aligned: bool) -> torch.Tensor:
    """``(R, C, out_h, out_w)``: each bin the mean of ``gh x gw`` bilinear samples at the centres of a regular grid
    (``gh = ceil(roi_h / out_h)`` when ``sampling`` is 0); a sample more than one pixel outside the map is 0, one
    within a pixel of the border is clamped to it. ``aligned`` shifts the box by half a pixel and lets it be smaller
    than one pixel. Differentiable in ``x``."""
    n, c, h, w = x.shape
    oh, ow = out_hw
    off = 0.5 if aligned else 0.0
    out = []
    for r in rois.tolist():
        b, x1, y1, x2, y2 = int(r[0]), *(v * scale - off for v in r[1:])
        rw, rh = x2 - x1, y2 - y1
        if not aligned:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / oh, rw / ow
        gh = sampling if sampling > 0 else math.ceil(rh / oh)
        gw = sampling if sampling > 0 else math.ceil(rw / ow)
        count = max(gh * gw, 1)
        bins = []
        for ph in range(oh):
            for pw in range(ow):
                acc = x.new_zeros(c)
                for iy in range(gh):
                    yy = y1 + ph * bh + (iy + 0.5) * bh / gh
                    for ix in range(gw):
                        xx = x1 + pw * bw + (ix + 0.5) * bw / gw
                        acc = acc + _bilinear(x[b], yy, xx, h, w)
                bins.append(acc / count)
        out.append(torch.stack(bins, 1).reshape(c, oh, ow))
    return torch.stack(out) if out else x.new_zeros(0, c, oh, ow)


def _bilinear(fm: torch.Tensor, y: float, x: float, h: int, w: int) -> torch.Tensor:
    if y < -1.0 or y > h or x < -1.0 or x > w:
        return fm.new_zeros(fm.shape[0])
    y, x = max(y, 0.0), max(x, 0.0)
    y0, x0 = int(y), int(x)
    if y0 >= h - 1:
        y0 = y1 = h - 1
        y = float(y0)
    else:
        y1 = y0 + 1
    if x0 >= w - 1:
        x0 = x1 = w - 1
        x = float(x0)
    else:
        x1 = x0 + 1
    ly, lx = y - y0, x - x0
    hy, hx = 1 - ly, 1 - lx
    return hy * hx * fm[:, y0, x0] + hy * lx * fm[:, y0, x1] + ly * hx * fm[:, y1, x0] + ly * lx * fm[:, y1, x1]


def nms_reference(boxes: torch.Tensor, scores: torch.Tensor, iou_thr: float) -> torch.Tensor:
    """Indices kept by greedy NMS (offset 0: areas ``(x2 - x1) * (y2 - y1)``), by descending score."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    keep = []
    b = boxes.double().tolist()
    for i in order:
        ok = True
        for j in keep:
            iw = max(0.0, min(b[i][2], b[j][2]) - max(b[i][0], b[j][0]))
            ih = max(0.0, min(b[i][3], b[j][3]) - max(b[i][1], b[j][1]))
            inter = iw * ih
            union = ((b[i][2] - b[i][0]) * (b[i][3] - b[i][1]) + (b[j][2] - b[j][0]) * (b[j][3] - b[j][1]) - inter)
            if inter / union > iou_thr:
                ok = False
                break
        if ok:
            keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


def _cases():
    """A feature map and boxes that exercise the adaptive grid (small and large boxes), boxes reaching past the
    border and below one pixel, two images."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 11, 14, generator=g, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 2.0, 9.5, 8.0], [1, 0.0, 0.0, 27.0, 21.0], [0, -4.0, -3.0, 5.0, 30.0],
                         [1, 10.2, 3.3, 10.6, 3.9], [0, 20.0, 14.0, 40.0, 30.0]], dtype=torch.float64)
    return x, rois


def _boxes():
    g = torch.Generator().manual_seed(1)
    xy = torch.rand(60, 2, generator=g) * 50
    wh = torch.rand(60, 2, generator=g) * 20 + 1
    return torch.cat([xy, xy + wh], 1), torch.rand(60, generator=g)


def _roi_align_with(kernels, x, rois, out_hw, scale, sampling, aligned):
    """RoIAlign forward and input gradient through an mmcv-style kernel pair (the ``_ext`` calling convention)."""
    out = x.new_zeros(rois.shape[0], x.shape[1], *out_hw)
    empty = x.new_zeros(0)
    kw = dict(aligned_height=out_hw[0], aligned_width=out_hw[1], spatial_scale=scale, sampling_ratio=sampling,
              pool_mode=1, aligned=aligned)
    kernels.roi_align_forward(x, rois, out, empty, empty, **kw)
    g = torch.arange(out.numel(), dtype=x.dtype).reshape(out.shape).sin()
    grad = torch.zeros_like(x)
    kernels.roi_align_backward(g.contiguous(), rois, empty, empty, grad, **kw)
    return out, grad, g


def _check_roi_align(kernels, dtype, tol):
    x64, rois64 = _cases()
    for out_hw, scale, sampling, aligned in (((7, 7), 0.5, 0, True), ((4, 5), 1.0, 2, True),
                                             ((3, 3), 0.25, 0, False), ((2, 4), 1.0, 1, False)):
        x, rois = x64.to(dtype), rois64.to(dtype)
        out, grad, g = _roi_align_with(kernels, x, rois, out_hw, scale, sampling, aligned)
        # the reference sees the input as rounded to ``dtype``; a copy (``double()`` of a float64 tensor is itself)
        xr = x.double().clone().requires_grad_(True)
        ref = roi_align_reference(xr, rois.double(), out_hw, scale, sampling, aligned)
        (ref * g.to(torch.float64)).sum().backward()
        case = f'{out_hw} scale {scale} sampling {sampling} aligned {aligned}'
        assert torch.allclose(out.double(), ref.detach(), rtol=tol, atol=tol), case
        assert torch.allclose(grad.double(), xr.grad, rtol=tol, atol=tol), case


@pytest.mark.skipif(not HAS_MMCV_EXT, reason='mmcv without compiled ops')
def test_reference_equals_mmcv_compiled_kernels():
    """The reference is mmcv's formulation: its compiled CPU kernels agree to float rounding (fp32), forward and
    input gradient; and its NMS keeps the same boxes in the same order."""
    from mmcv.utils import ext_loader
    ext = ext_loader.load_ext('_ext', list(mmcv_ops.TORCHVISION_KERNELS))
    _check_roi_align(ext, torch.float32, 1e-5)
    boxes, scores = _boxes()
    for thr in (0.1, 0.5, 0.7):
        assert torch.equal(ext.nms(boxes, scores, iou_threshold=thr, offset=0), nms_reference(boxes, scores, thr))


@pytest.mark.skipif(not HAS_TORCHVISION, reason='torchvision not importable beside this torch (runs on the GPU '
                    'check machine)')
@pytest.mark.parametrize('device', ['cpu', 'cuda'])
def test_torchvision_stand_ins_equal_the_reference(device):
    """The stand-ins, called with mmcv's ``_ext`` convention, equal the reference: RoIAlign forward and input
    gradient in float64, NMS indices."""
    if device == 'cuda' and not torch.cuda.is_available():
        pytest.skip('no CUDA device')
    import torchvision  # noqa: F401

    class Kernels:
        roi_align_forward = staticmethod(mmcv_ops._tv_roi_align_forward)
        roi_align_backward = staticmethod(mmcv_ops._tv_roi_align_backward)

    x64, rois64 = _cases()
    dev = torch.device(device)

    class OnDevice:  # run the kernels on the device, compare on the CPU
        @staticmethod
        def roi_align_forward(x, rois, out, ay, ax, **kw):
            o = out.to(dev)
            Kernels.roi_align_forward(x.to(dev), rois.to(dev), o, ay.to(dev), ax.to(dev), **kw)
            out.copy_(o.cpu())

        @staticmethod
        def roi_align_backward(g, rois, ay, ax, grad, **kw):
            o = grad.to(dev)
            Kernels.roi_align_backward(g.to(dev), rois.to(dev), ay.to(dev), ax.to(dev), o, **kw)
            grad.copy_(o.cpu())

    _check_roi_align(OnDevice, torch.float64, 1e-10)
    _check_roi_align(OnDevice, torch.bfloat16, 2e-2)  # computed in fp32, rounded to bf16 (2^-8) on the way out
    boxes, scores = _boxes()
    for thr in (0.1, 0.5, 0.7):
        kept = mmcv_ops._tv_nms(boxes.to(dev), scores.to(dev), thr, 0).cpu()
        assert torch.equal(kept, nms_reference(boxes, scores, thr))
        for dtype in (torch.float16, torch.bfloat16):  # reduced precision: the same boxes as the rounded ones keep
            b, s = boxes.to(dtype), scores.to(dtype)
            kept = mmcv_ops._tv_nms(b.to(dev), s.to(dev), thr, 0).cpu()
            assert torch.equal(kept, nms_reference(b.float(), s.float(), thr)), dtype
    with pytest.raises(NotImplementedError, match='offset=1'):
        mmcv_ops._tv_nms(boxes, scores, 0.5, 1)


def test_stand_in_names_every_kernel_and_refuses_the_unserved_ones():
    """``mmcv.ops`` checks its kernel names at import: the stand-in has them all, but a kernel torchvision does not
    serve raises NotImplementedError naming itself (never a wrong result); dunder lookups stay AttributeErrors
    (import machinery, pickling)."""
    ext = mmcv_ops._TorchvisionExt('mmcv._ext')
    with pytest.raises(NotImplementedError, match="'deform_conv_forward'.*nms, roi_align_forward"):
        ext.deform_conv_forward(torch.zeros(1))
    assert not hasattr(ext, '__path__')
    empty = torch.zeros(0)
    with pytest.raises(NotImplementedError, match='max-pooled'):
        mmcv_ops._tv_roi_align_forward(empty, empty, empty, empty, empty, aligned_height=2, aligned_width=2,
                                       spatial_scale=1.0, sampling_ratio=0, pool_mode=0, aligned=True)


STAND_IN_CHILD = r"""
import importlib.machinery, sys, types
find = importlib.machinery.PathFinder.find_spec
def hide_ext(name, path=None, target=None):  # mmcv as installed without its compiled ops
    return None if name == 'mmcv._ext' else find(name, path, target)
importlib.machinery.PathFinder.find_spec = staticmethod(hide_ext)
if 'torchvision' not in sys.argv:  # where torchvision does not import beside this torch: its name only
    sys.modules['torchvision'] = types.ModuleType('torchvision')
    sys.modules['torchvision'].__version__ = 'n/a'
import mmplugin
from mmplugin.engine.mmcv_ops import install_torchvision_kernels
assert 'mmcv.ops' not in sys.modules, 'mmplugin imported mmcv.ops before the stand-in could be installed'
assert install_torchvision_kernels() is True and install_torchvision_kernels() is True
import mmcv.ops
from mmcv.utils import collect_env
from mmengine.utils.dl_utils import mmcv_full_available
from mmengine.registry import init_default_scope
assert isinstance(mmcv_full_available(), bool)  # answers (mmengine: False, no loader; onedl's fork: True, a spec)
collect_env()  # mmcv's environment report asks the extension for its compiler versions
print('compiler', mmcv.ops.get_compiler_version())
try:
    mmcv.ops.deform_conv2d
    sys.modules['mmcv._ext'].deform_conv_forward()
except NotImplementedError as err:
    print('refused', err)
from mmplugin.apis import build_model, load_config
cfg = load_config('configs/swin/swin_t_maskrcnn_1x_coco.py')
cfg.model.backbone.pop('init_cfg', None)
from mmengine.optim import build_optim_wrapper
wrapper = {k: v for k, v in cfg.optim_wrapper.items() if k not in ('loss_scale', 'dtype')}
wrapper['type'] = 'OptimWrapper'  # the config's AMP wrapper wants a GPU; the constructor is what is checked
build_optim_wrapper(build_model(cfg), wrapper)  # its paramwise_cfg asks mmcv_full_available()
print('optimizer built')
"""


def test_stand_in_installs_where_mmcv_has_no_ops_and_the_stack_still_builds():
    """In a fresh process where ``mmcv._ext`` cannot be found: ``import mmplugin`` does not import ``mmcv.ops``, the
    stand-in installs (idempotently), ``mmcv.ops`` imports, mmengine's ``mmcv_full_available`` answers instead of
    raising, mmcv's environment report runs and names the kernels' origin, an unserved kernel refuses by name, and a
    Swin detector with its config's optimizer (``paramwise_cfg``) builds."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, '-c', STAND_IN_CHILD, *(['torchvision'] if HAS_TORCHVISION else [])],
                         cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert 'compiler n/a (kernels from torchvision)' in out.stdout
    assert "refused mmcv was installed without its compiled ops and torchvision has no 'deform_conv_forward'" in \
        out.stdout
    assert 'optimizer built' in out.stdout


@pytest.mark.skipif(not HAS_MMCV_EXT, reason='mmcv without compiled ops')
def test_install_leaves_mmcv_compiled_ops_alone():
    """Where mmcv has its own extension nothing is replaced."""
    import sys

    import mmcv.ops  # noqa: F401
    before = sys.modules['mmcv._ext']
    assert mmcv_ops.install_torchvision_kernels() is False
    assert sys.modules['mmcv._ext'] is before
