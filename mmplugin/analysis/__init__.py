"""Measuring the backbones and the models: complexity (parameters, MACs), side-by-side timing, training-step peak
memory, the per-family benchmark peers, the speed table's rows and a busy-machine check. ``tools/get_flops.py``,
``tools/benchmark.py`` and ``tools/speed_table.py`` are command lines over these."""
from .complexity import backbone_complexity, model_complexity
from .load import load_warning, machine_load
from .memory import enable_checkpointing, measure_peak_memory, peak_memory, supports_checkpointing
from .peers import PEERS, benchmark_models, build_peers, register_peers
from .timing import parse_hw, time_models

__all__ = ['backbone_complexity', 'model_complexity', 'load_warning', 'machine_load', 'enable_checkpointing',
           'measure_peak_memory', 'peak_memory', 'supports_checkpointing', 'PEERS', 'benchmark_models',
           'build_peers', 'register_peers', 'parse_hw', 'time_models']
