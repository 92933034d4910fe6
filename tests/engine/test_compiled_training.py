"""``compile_backbone`` (tools/train.py --compile-backbone): the backbone is compiled in place, so the model, its
modules and its state dict keys are unchanged; a model without a backbone is refused. The losses of compiled
training against eager training: tests/cli/test_tools_end_to_end.py::test_compiled_backbone_trains_like_eager."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmplugin.engine.compiled import compile_backbone


class _Detector(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
        self.head = nn.Conv2d(4, 2, 1)


def test_backbone_is_compiled_in_place_with_the_same_state_dict():
    model = _Detector()
    keys, backbone = list(model.state_dict()), model.backbone
    assert compile_backbone(model) is backbone and model.backbone is backbone
    assert backbone._compiled_call_impl is not None and getattr(model.head, '_compiled_call_impl', None) is None
    assert list(model.state_dict()) == keys


def test_a_model_without_a_backbone_is_refused():
    with pytest.raises(ValueError, match='Sequential has no backbone module'):
        compile_backbone(nn.Sequential(nn.Linear(2, 2)))
    torch.compiler.reset()
