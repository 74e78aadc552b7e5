"""``attn-export bench``: every variant of a layer side by side, against the machine's ceilings.

Names load lazily (PEP 562): ``bench --help`` reads the light ``grid`` without importing torch.
"""

from attn_export.host.lazy import lazy_exports

_WHERE = {"Ceilings": "ceilings", "measure_ceilings": "ceilings", "FlopCount": "flops", "count_flops": "flops", "count_module_flops": "flops",
          "BenchConfig": "harness", "run_bench": "harness", "markdown_tables": "table", "results_table": "table", "variants_table": "table",
          "VARIANTS": "variants"}  # fmt: skip
__all__ = [
    "VARIANTS",
    "BenchConfig",
    "Ceilings",
    "FlopCount",
    "count_flops",
    "count_module_flops",
    "markdown_tables",
    "measure_ceilings",
    "results_table",
    "run_bench",
    "variants_table",
]
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)

