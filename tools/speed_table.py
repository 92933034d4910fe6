"""Backbone speed against the CPU's own matmul peak, the peers and the deployment runtimes, in one process.

    python tools/speed_table.py [--size 800x1216] [--rounds 5] [--models swin:tiny swiftformer:l1]
        [--runtimes eager onnxruntime openvino] [--bf16 auto|on|off] [--whole CONFIG[@HxW] ...] [--json F]

For each backbone (batch 1, eval, random weights): median seconds of interleaved rounds for the family's peers
(``benchmark_peers``, e.g. mmdet's Swin) and the plugin in eager fp32, the plugin exported to ONNX (dynamic sizes)
in onnxruntime and OpenVINO (when installed; f32 inference precision), and under bf16 autocast where the CPU has
bf16 kernels (``--bf16 on`` forces it on CPUs that emulate bf16). Each row gives GFLOP/s (2 x the multiply-adds
counted by ``tools/get_flops.py``), the share of a 4096x4096 matmul's GFLOP/s timed in the same
interleaved rounds in the same precision, the speed ratio to the first peer, and the accuracy cost (max relative error of the
outputs against the plugin's eager fp32 outputs).

``--whole CONFIG`` also times a whole detector / segmentor's inference (random weights, every proposal kept) and
the share of it spent in ``extract_feat`` (backbone + neck), which bounds what a reduced-precision backbone
(``tools/test.py --fast``) can gain on the whole model.

Numbers depend on the processor: the CPU model and the command are printed with the table; quote them with it.
"""
from __future__ import annotations

import argparse
import json
import os
import os.path as osp
import platform
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, osp.join(osp.dirname(osp.abspath(__file__)), '..'))
sys.path.insert(0, osp.dirname(osp.abspath(__file__)))

from mmplugin.deploy import flatten_outputs  # noqa: E402
from mmplugin.utils.timing import interleaved  # noqa: E402


def cpu_model() -> str:
    try:
        out = subprocess.run(['lscpu'], capture_output=True, text=True, timeout=10).stdout
        info = dict(line.split(':', 1) for line in out.splitlines() if ':' in line)
        name = info.get('Model name', '').strip()
        fam, model = info.get('CPU family', '').strip(), info.get('Model', '').strip()
        flags = info.get('Flags', '').split()
        isa = [f for f in ('avx2', 'avx512f', 'avx512_bf16', 'amx_bf16') if f in flags]
        return f'{name} (family {fam}, model {model}; {", ".join(isa) or "no AVX2"})'
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or 'unknown CPU'


def backbone_rows(family: str, arch: str, size, rounds: int, runtimes, bf16: bool, workdir: str) -> list[dict]:
    from mmplugin import deploy
    from mmplugin.models.backbones.base import get_family
    cls = get_family(family)
    torch.manual_seed(0)
    ours = cls(arch).eval()
    peers = cls.benchmark_peers(arch, ours)
    for m in peers.values():
        m.eval()  # mmdet's Swin.train() returns None: no chaining
    x = torch.randn(1, 3, *size)
    from get_flops import complexity  # the FLOP count of tools/get_flops.py (SDPA products included)
    flops = 2e9 * complexity(family, arch, size)[1]
    with torch.no_grad():
        ref = flatten_outputs(ours(x))
    fns, outs = {}, {}

    def eager(m, dtype=None):
        def fn():
            with torch.no_grad(), torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                outs[fn] = flatten_outputs(m(x))
        return fn

    for name, m in peers.items():
        fns[(name, 'eager', 'fp32')] = eager(m)
    fns[('mmplugin', 'eager', 'fp32')] = eager(ours)
    if bf16:
        for name, m in peers.items():
            fns[(name, 'eager', 'bf16 autocast')] = eager(m, torch.bfloat16)
        fns[('mmplugin', 'eager', 'bf16 autocast')] = eager(ours, torch.bfloat16)
    onnx_path = osp.join(workdir, f'{family}_{arch}.onnx')
    if {'onnxruntime', 'openvino'} & set(runtimes):
        t = time.perf_counter()
        deploy.export_onnx(deploy.ExportPart(ours, 'backbone'), onnx_path, deploy.example_input(2, (224, 256)))
        print(f'  exported {family} {arch} to ONNX in {time.perf_counter() - t:.0f} s', flush=True)
    if 'onnxruntime' in runtimes:
        sess = deploy.onnx_session(onnx_path)

        def ort_fn():
            outs[ort_fn] = tuple(torch.from_numpy(o) for o in sess.run(None, {'input': x.numpy()}))
        fns[('mmplugin', 'onnxruntime', 'fp32')] = ort_fn
    if 'openvino' in runtimes:
        try:
            import openvino as ov
        except ImportError:
            print('  openvino not installed: no OpenVINO row (pip install openvino)')
        else:
            compiled = ov.Core().compile_model(onnx_path, 'CPU', {'INFERENCE_PRECISION_HINT': 'f32'})

            def ov_fn():
                res = compiled({0: x.numpy()})
                outs[ov_fn] = tuple(torch.from_numpy(res[o]) for o in compiled.outputs)
            fns[('mmplugin', 'openvino', 'fp32')] = ov_fn
    # the matmul peak is timed in the same interleaved rounds, so machine noise hits it like the models
    n = 4096
    mats = {p: (torch.randn(n, n, dtype=d), torch.randn(n, n, dtype=d))
            for p, d in (('fp32', torch.float32), ('bf16 autocast', torch.bfloat16)) if p == 'fp32' or bf16}
    for p, (a, b) in mats.items():
        fns[('matmul', p)] = lambda a=a, b=b: torch.mm(a, b)
    times = interleaved(fns, rounds)
    peaks = {p: 2 * n**3 / times.pop(('matmul', p)) / 1e9 for p in mats}
    baseline = times[next(iter(times))]
    rows = []
    for key, sec in times.items():
        name, runtime, precision = key
        try:  # peers computing the same function with the same weights get an error too
            err = deploy.max_rel_error(outs[fns[key]], ref)
        except ValueError:  # another network (e.g. a ResNet peer): other shapes
            err = None
        same = err is not None  # another network (other outputs) has other FLOPs: no GFLOP/s for it
        rows.append(dict(backbone=f'{family} {arch}', impl=name, runtime=runtime, precision=precision, seconds=sec,
                         gflops=flops / sec / 1e9 if same else None, ratio=baseline / sec, rel_err=err,
                         model_gflop=flops / 1e9, peak_gflops=peaks.get(precision)))
    return rows


def whole_model_rows(config: str, size, rounds: int) -> list[dict]:
    """Whole-model eval time and the share spent in ``extract_feat`` (random weights, thresholds at 0)."""
    from mmengine.config import Config

    from export import build_model  # the same builder as tools/export.py (scope, no pretrained weights)
    cfg = Config.fromfile(config)
    scope = cfg.get('default_scope', 'mmdet')
    if cfg.model.get('test_cfg', {}).get('rcnn') is not None:
        cfg.model.test_cfg.rcnn.score_thr = 0.0  # the heads see the full number of boxes a trained model would
    torch.manual_seed(0)
    model = build_model(cfg, None, announce_random=False)
    h, w = size
    x = torch.randn(1, 3, h, w)
    meta = dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w), batch_input_shape=(h, w),
                scale_factor=(1.0, 1.0))
    if scope == 'mmseg':
        from mmseg.structures import SegDataSample
        sample = SegDataSample(metainfo=meta)
    else:
        from mmdet.structures import DetDataSample
        sample = DetDataSample(metainfo=meta)
    with torch.no_grad():
        times = interleaved({'whole': lambda: model.predict(x, [sample]), 'extract_feat': lambda: model.extract_feat(x)},
                            rounds)
    return [dict(config=osp.basename(config), size=list(size), whole_seconds=times['whole'], extract_feat_seconds=times['extract_feat'],
                 extract_feat_share=times['extract_feat'] / times['whole'])]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--size', default='800x1216', help='HxW (default 800x1216, a COCO test image)')
    p.add_argument('--rounds', type=int, default=5)
    p.add_argument('--models', nargs='+', default=['swin:tiny', 'swiftformer:l1'], help='FAMILY:ARCH')
    p.add_argument('--runtimes', nargs='*', default=['eager', 'onnxruntime', 'openvino'],
                   choices=['eager', 'onnxruntime', 'openvino'])
    p.add_argument('--bf16', choices=['auto', 'on', 'off'], default='auto',
                   help='bf16 autocast rows: auto = only where the CPU has bf16 kernels')
    p.add_argument('--whole', nargs='*', default=[],
                   help='CONFIG[@HxW]: configs whose whole-model inference is also timed (at --size unless @HxW)')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--json', default=None)
    args = p.parse_args(argv)
    import mmplugin  # noqa: F401
    from mmplugin.deploy import native_low_precision
    if args.threads:
        torch.set_num_threads(args.threads)
    size = tuple(int(v) for v in args.size.lower().split('x'))
    native_bf16 = native_low_precision('cpu') is torch.bfloat16
    bf16 = args.bf16 == 'on' or (args.bf16 == 'auto' and native_bf16)
    cpu = cpu_model()
    command = 'python tools/speed_table.py ' + ' '.join(argv if argv is not None else sys.argv[1:])
    print(f'CPU: {cpu}; {torch.get_num_threads()} threads; torch {torch.__version__}\ncommand: {command}', flush=True)
    print('4096x4096 matmul GFLOP/s is timed in the same rounds as each backbone (column "matmul peak")'
          + ('' if native_bf16 else '; this CPU has no bf16 kernels (bf16 rows only with --bf16 on, emulated)'),
          flush=True)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for spec in args.models:
            family, arch = spec.split(':')
            print(f'timing {family} {arch} at {size[0]}x{size[1]} ...', flush=True)
            rows += backbone_rows(family, arch, size, args.rounds, args.runtimes, bf16, workdir)
    print(f'\n| backbone ({size[0]}x{size[1]}, batch 1) | implementation | runtime | precision | ms | GFLOP/s | '
          'matmul peak GFLOP/s | % of peak | speed vs first row | max rel. error vs plugin eager fp32 (- : another '
          'network) |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for r in rows:
        pk, gf = r['peak_gflops'], r['gflops']
        share = f'{100 * gf / pk:.0f}%' if pk and gf else '-'
        err = '-' if r['rel_err'] is None else f'{r["rel_err"]:.1e}'
        print(f'| {r["backbone"]} ({r["model_gflop"]:.0f} GFLOP) | {r["impl"]} | {r["runtime"]} | {r["precision"]} | '
              f'{1000 * r["seconds"]:.0f} | {"-" if gf is None else f"{gf:.0f}"} | {pk or 0:.0f} | {share} | '
              f'{r["ratio"]:.2f}x | {err} |')
    whole = []
    for spec in args.whole:
        config, _, at = spec.partition('@')
        wsize = tuple(int(v) for v in at.lower().split('x')) if at else size
        print(f'\ntiming the whole {osp.basename(config)} at {wsize[0]}x{wsize[1]} ...', flush=True)
        whole += whole_model_rows(config, wsize, args.rounds)
    for r in whole:
        print(f'{r["config"]} at {r["size"][0]}x{r["size"][1]}: whole inference {1000 * r["whole_seconds"]:.0f} ms, extract_feat (backbone + neck) '
              f'{1000 * r["extract_feat_seconds"]:.0f} ms = {100 * r["extract_feat_share"]:.0f}%: however fast the '
              f'backbone + neck, the whole model gains at most {1 / max(1 - r["extract_feat_share"], 1e-9):.1f}x')
    if args.json:
        with open(args.json, 'w') as f:
            json.dump(dict(cpu=cpu, command=command, rows=rows, whole=whole), f, indent=2)
    return rows, whole


if __name__ == '__main__':
    main()
