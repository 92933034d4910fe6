"""Generate the demo datasets (deterministic): COCO-format shapes and ADE20K-layout shapes.

    python tools/make_demo_data.py [--root data/demo] [--seed 0]
"""
import argparse
import os.path as osp
import time

from mmplugin.cli.common import run_tool, tool_main


@tool_main
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--root', default='data/demo')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--num-train', type=int, default=400)
    p.add_argument('--num-val', type=int, default=60)
    args = p.parse_args(argv)
    from mmplugin.demo import make_instance_dataset, make_semantic_dataset
    t = time.time()
    make_instance_dataset(osp.join(args.root, 'shapes_coco'), args.num_train, args.num_val, seed=args.seed)
    make_semantic_dataset(osp.join(args.root, 'shapes_ade'), args.num_train, args.num_val, seed=args.seed + 1)
    print(f'demo data written to {args.root} ({args.num_train} train / {args.num_val} val images per task, '
          f'seed {args.seed}, {time.time() - t:.1f} s)')


if __name__ == '__main__':
    run_tool(main)
