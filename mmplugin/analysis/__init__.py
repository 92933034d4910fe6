"""Measuring the backbones and the models: complexity (parameters, MACs), side-by-side timing, training-step peak
memory, the per-family benchmark peers, the speed table's rows and a busy-machine check. ``tools/get_flops.py``,
``tools/benchmark.py`` and ``tools/speed_table.py`` are command lines over these."""
from mmplugin.analysis.complexity import backbone_complexity, model_complexity
from mmplugin.analysis.load import load_warning, machine_load
from mmplugin.analysis.memory import enable_checkpointing, measure_peak_memory, peak_memory, supports_checkpointing
from mmplugin.analysis.peers import PEERS, benchmark_models, build_peers, register_peers
from mmplugin.analysis.timing import parse_hw, time_models

__all__ = ['backbone_complexity', 'model_complexity', 'load_warning', 'machine_load', 'enable_checkpointing',
           'measure_peak_memory', 'peak_memory', 'supports_checkpointing', 'PEERS', 'benchmark_models',
           'build_peers', 'register_peers', 'parse_hw', 'time_models']
