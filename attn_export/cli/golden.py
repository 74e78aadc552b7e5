"""``attn-export golden record`` and the ``check --golden`` gate: known-good outputs per deployment.

Record once on the stack that was verified; on a new TensorRT, CUDA, JetPack or onnxruntime,
``attn-export check MODEL --golden DIR`` re-runs the artifact on the stored inputs, judges it
with the subject's metrics (``deploy.golden_judge``) and prints the old and new stack side by
side; a regression exits 1 naming the outputs and texts that moved most (docs/targets.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from attn_export.cli.help import App
from attn_export.errors import ConfigError

__all__ = ["golden_app", "register", "run_golden_check"]

golden_app = App(help="Record golden outputs of a verified artifact (gate upgrades with check --golden).", no_args_is_help=True)

_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def _providers(provider: str | None) -> list[str] | None:
    if provider is None:
        return None
    if provider not in _PROVIDERS:
        raise ConfigError(f"--provider {provider!r} is not known; use one of {sorted(_PROVIDERS)}")
    return [_PROVIDERS[provider]]


def _texts(path: Path | None) -> list[str] | None:
    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(f"--texts {path} does not exist; pass the file of texts the inputs came from, one per line")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"--texts {path} is not UTF-8 (byte {err.object[err.start]:#04x} at offset {err.start}); "
                          "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8) and pass it again") from None
    except OSError as err:
        raise ConfigError(f"--texts {path}: cannot read it ({err.strerror or err}); "
                          "pass a readable file of texts, one per line") from None
    return [line for line in text.splitlines() if line.strip()]


@golden_app.command("record")
def record(
    model: Annotated[Path, typer.Argument(help="Verified ONNX model or TensorRT engine (.engine/.plan).")],
    inputs: Annotated[Path, typer.Option("--inputs", help="Report-split inputs: .npz or Polygraphy inputs JSON.")],
    golden: Annotated[Path, typer.Option("--golden", help="Folder to write golden.json, inputs.json, stack.json.")],
    texts: Annotated[Path | None, typer.Option("--texts", help="The inputs' texts, one per line (named on failure).", show_default="none")] = None,
    labels: Annotated[list[str] | None, typer.Option("--labels", help="An output holding logits: judged by label agreement.", show_default="none")] = None,
    provider: Annotated[str | None, typer.Option("--provider", help="ONNX Runtime provider for .onnx: cpu or cuda.", show_default="cpu")] = None,
    force: Annotated[bool, typer.Option("--force", metavar="", help="Move files attn-export did not write aside, not refuse.")] = False,
) -> None:
    """Run the artifact on the inputs and store its outputs with this stack (GPU, TensorRT, CUDA, JetPack)."""
    from attn_export.cli._common import out_console
    from attn_export.deploy.golden import read_feeds, record_golden

    providers = _providers(provider)
    if not model.is_file():
        raise ConfigError(f"{model} is not a file; pass the ONNX model or TensorRT engine to record")
    lines = _texts(texts)  # read before the inputs and the model: a bad file is refused before any work
    meta = record_golden(golden, model, read_feeds(inputs), labels=tuple(labels or ()), texts=lines, providers=providers,
                         force=force)
    stack = ", ".join(f"{k} {v}" for k, v in meta.stack.items() if v and k != "host")
    out_console.print(f"recorded golden outputs of {model.name} in {golden}: {', '.join(f'{k} ({v})' for k, v in meta.kinds.items())}; stack: {stack}",
                      highlight=False, soft_wrap=True, markup=False)  # fmt: skip


def _stack_table(old: dict[str, str | None], new: dict[str, str | None]) -> object:
    from rich.table import Table

    table = Table(title="stack: golden vs now")
    for column in ("", "golden", "now"):
        table.add_column(column)
    for key in dict.fromkeys([*old, *new]):
        a, b = old.get(key), new.get(key)
        table.add_row(key, a or "-", b or "-", style=None if a == b else "bold")
    return table


def run_golden_check(model: Path, golden_dir: Path, provider: str | None = None, as_json: bool = False, quiet: bool = False) -> int:
    """Re-run ``model`` on the golden inputs and judge it; 0 pass, 1 a regression (named)."""
    from rich.table import Table

    from attn_export.cli._common import out_console
    from attn_export.deploy.golden import current_stack, load_golden, run_artifact
    from attn_export.deploy.golden_judge import GoldenThresholds, judge_golden

    providers = _providers(provider)
    if model.is_dir():
        raise ConfigError(f"{model} is a folder; with --golden pass the model or engine file to check (e.g. {model}/model.onnx)")
    golden = load_golden(golden_dir)
    new_stack = current_stack(model, providers)
    _, outputs = run_artifact(model, golden.inputs, providers)
    verdict = judge_golden(golden.outputs, outputs, golden.meta.kinds, GoldenThresholds(**golden.meta.thresholds.model_dump()), golden.meta.texts)
    failures = verdict.failure_lines()
    if as_json:
        print(json.dumps({"passed": verdict.passed, "golden_stack": golden.meta.stack, "stack": new_stack, "failures": failures,
                          "outputs": {o.name: {"kind": o.kind, **o.metrics} for o in verdict.outputs}}, indent=2))  # fmt: skip
    else:
        if not quiet:
            out_console.print(_stack_table(golden.meta.stack, new_stack))
            table = Table(title=f"{model.name} vs golden {golden_dir}")
            for column in ("output", "kind", "metric", "value", "verdict"):
                table.add_column(column)
            for o in verdict.outputs:
                for metric, value in o.metrics.items():
                    table.add_row(o.name, o.kind, metric, f"{value:.5g}", "ok" if o.passed else "MOVED")
            out_console.print(table)
        for line in failures:
            out_console.print(f"FAIL {line}", highlight=False, soft_wrap=True, markup=False)
        if verdict.passed:
            out_console.print(f"PASS {model.name} matches the golden outputs of {golden.meta.artifact} on {len(golden.inputs)} batches",
                              highlight=False, soft_wrap=True, markup=False)  # fmt: skip
    return 0 if verdict.passed else 1


def register(app: typer.Typer) -> None:
    """Add the ``golden`` command group to the main CLI."""
    app.add_typer(golden_app, name="golden")
