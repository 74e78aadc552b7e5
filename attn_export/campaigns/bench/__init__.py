"""``attn-export bench``: every variant of a layer side by side, against the machine's ceilings."""

from attn_export.campaigns.bench.ceilings import Ceilings, measure_ceilings
from attn_export.campaigns.bench.flops import FlopCount, count_flops, count_module_flops
from attn_export.campaigns.bench.harness import BenchConfig, run_bench
from attn_export.campaigns.bench.table import markdown_tables, results_table, variants_table
from attn_export.campaigns.bench.variants import VARIANTS
from attn_export.validate.memory import peak_memory_delta

__all__ = [
    "VARIANTS",
    "BenchConfig",
    "Ceilings",
    "FlopCount",
    "count_flops",
    "count_module_flops",
    "markdown_tables",
    "measure_ceilings",
    "peak_memory_delta",
    "results_table",
    "run_bench",
    "variants_table",
]
