"""A literal Swin V1/V2 in the official detection formulation, used as a test oracle.

Written from the papers (arXiv 2103.14030 §3.2, 2111.09883 §3.2-3.3) and the official key layout
(``official_keys_swin.txt``), the straightforward way: per block, norm -> pad bottom/right to a window multiple ->
``torch.roll`` -> partition -> ``q k^T`` + bias (+ shift mask built by slice assignment) -> softmax -> reverse ->
roll back -> crop. V2: res-post-norm, cosine attention with a clamped per-head logit scale, log-spaced
continuous position bias. Patch merging concatenates ``x[0::2, 0::2], x[1::2, 0::2], x[0::2, 1::2],
x[1::2, 1::2]``. Output norms ``norm{i}`` (LayerNorm) on every stage.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _partition(x, ws):
    b, h, w, c = x.shape
    x = x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, ws * ws, c)


def _reverse(win, ws, h, w):
    b = win.shape[0] // ((h // ws) * (w // ws))
    x = win.view(b, h // ws, w // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(b, h, w, -1)


def _shift_mask(hp, wp, ws, s):
    img = torch.zeros(1, hp, wp, 1)
    cnt = 0
    for hs in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
        for wsl in (slice(0, -ws), slice(-ws, -s), slice(-s, None)):
            img[:, hs, wsl, :] = cnt
            cnt += 1
    win = _partition(img, ws).squeeze(-1)
    mask = win.unsqueeze(1) - win.unsqueeze(2)
    return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)


def _rel_index(ws):
    ys, xs = torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing='ij')
    coords = torch.stack([ys.flatten(), xs.flatten()])
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (ws - 1)
    return rel[..., 0] * (2 * ws - 1) + rel[..., 1]


class _Attn(nn.Module):

    def __init__(self, dim, heads, ws, v2, pretrained_ws):
        super().__init__()
        self.heads, self.ws, self.v2 = heads, ws, v2
        if v2:
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(heads, 1, 1)))
            self.cpb_mlp = nn.Sequential(nn.Linear(2, 512), nn.ReLU(), nn.Linear(512, heads, bias=False))
            r = torch.arange(-(ws - 1), ws, dtype=torch.float32)
            t = torch.stack(torch.meshgrid(r, r, indexing='ij'), -1)
            t = t / (pretrained_ws - 1) * 8
            self.register_buffer('table', torch.sign(t) * torch.log2(t.abs() + 1) / math.log2(8), persistent=False)
            self.qkv = nn.Linear(dim, 3 * dim, bias=False)
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * ws - 1)**2, heads))
            self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer('index', _rel_index(ws), persistent=False)

    def forward(self, x, mask):
        bw, n, c = x.shape
        if self.v2:
            bias = torch.cat([self.q_bias, torch.zeros_like(self.v_bias), self.v_bias])
            qkv = F.linear(x, self.qkv.weight, bias)
        else:
            qkv = self.qkv(x)
        q, k, v = qkv.reshape(bw, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.v2:
            attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
            attn = attn * torch.exp(torch.clamp(self.logit_scale, max=math.log(100.0)))
            table = self.cpb_mlp(self.table).view(-1, self.heads)
            rel = 16 * torch.sigmoid(table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1))
        else:
            attn = (q * (c // self.heads)**-0.5) @ k.transpose(-2, -1)
            rel = self.relative_position_bias_table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        attn = attn + rel.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(bw // nw, nw, self.heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, n, n)
        attn = attn.softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(bw, n, c))


class _Block(nn.Module):

    def __init__(self, dim, heads, ws, shift, v2, pretrained_ws):
        super().__init__()
        self.ws, self.shift, self.v2 = ws, shift, v2
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attn(dim, heads, ws, v2, pretrained_ws)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential()
        self.mlp.fc1 = nn.Linear(dim, 4 * dim)
        self.mlp.act = nn.GELU()
        self.mlp.fc2 = nn.Linear(4 * dim, dim)

    def _attention(self, x, h, w):
        b, _, c = x.shape
        ws, s = self.ws, self.shift
        x = x.view(b, h, w, c)
        hp, wp = math.ceil(h / ws) * ws, math.ceil(w / ws) * ws
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        mask = None
        if s:
            x = torch.roll(x, (-s, -s), dims=(1, 2))
            mask = _shift_mask(hp, wp, ws, s)
        out = _reverse(self.attn(_partition(x, ws), mask), ws, hp, wp)
        if s:
            out = torch.roll(out, (s, s), dims=(1, 2))
        return out[:, :h, :w, :].reshape(b, h * w, c)

    def forward(self, x, h, w):
        if self.v2:
            x = x + self.norm1(self._attention(x, h, w))
            return x + self.norm2(self.mlp(x))
        x = x + self._attention(self.norm1(x), h, w)
        return x + self.mlp(self.norm2(x))


class _Merge(nn.Module):

    def __init__(self, dim, v2):
        super().__init__()
        self.v2 = v2
        self.reduction = nn.Linear(4 * dim, 2 * dim, bias=False)
        self.norm = nn.LayerNorm(2 * dim if v2 else 4 * dim)

    def forward(self, x, h, w):
        b, _, c = x.shape
        x = x.view(b, h, w, c)
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
        x = x.view(b, -1, 4 * c)
        return self.norm(self.reduction(x)) if self.v2 else self.reduction(self.norm(x))


class _Layer(nn.Module):

    def __init__(self, dim, depth, heads, ws, v2, pretrained_ws, last, shift=True):
        super().__init__()
        self.blocks = nn.ModuleList(
            [_Block(dim, heads, ws, 0 if j % 2 == 0 or not shift else ws // 2, v2, pretrained_ws)
             for j in range(depth)])
        self.downsample = None if last else _Merge(dim, v2)


class ReferenceSwin(nn.Module):
    """Official-formulation Swin (V1 or V2) with an output LayerNorm per stage, official key names.

    ``window_size`` and ``shifts`` per stage let it stand for the official *classification* code built for one
    input size, which shrinks the window of a small map to the map and drops its shift.
    """

    def __init__(self, embed_dims=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), window_size=7, v2=False,
                 pretrained_window_size=0, shifts=(True, True, True, True)):
        super().__init__()
        wss = [window_size] * 4 if isinstance(window_size, int) else list(window_size)
        pws = [pretrained_window_size] * 4 if isinstance(pretrained_window_size, int) else list(pretrained_window_size)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, embed_dims, 4, 4)
        self.patch_embed.norm = nn.LayerNorm(embed_dims)
        self.layers = nn.ModuleList([
            _Layer(embed_dims * 2**i, depths[i], num_heads[i], wss[i], v2, pws[i] or wss[i], i == 3, shifts[i])
            for i in range(4)
        ])
        for i in range(4):
            self.add_module(f'norm{i}', nn.LayerNorm(embed_dims * 2**i))

    def forward(self, x):
        h, w = x.shape[-2:]
        x = F.pad(x, (0, (-w) % 4, 0, (-h) % 4))
        x = self.patch_embed.proj(x)
        h, w = x.shape[-2:]
        x = self.patch_embed.norm(x.flatten(2).transpose(1, 2))
        outs = []
        for i, layer in enumerate(self.layers):
            for blk in layer.blocks:
                x = blk(x, h, w)
            outs.append(getattr(self, f'norm{i}')(x).view(x.shape[0], h, w, -1).permute(0, 3, 1, 2))
            if layer.downsample is not None:
                x = layer.downsample(x, h, w)
                h, w = (h + 1) // 2, (w + 1) // 2
        return tuple(outs)
