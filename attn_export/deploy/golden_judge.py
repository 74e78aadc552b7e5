"""Judge a deployment's outputs against its golden outputs with the subject's own metrics.

Why not Polygraphy's comparator: it judges each array with atol/rtol, while an embedding is
judged by its users on cosine and on which texts come out as neighbours, a classifier on its
labels. So each output is judged by its kind (``OUTPUT_KINDS``):

* ``embedding`` (texts, dim): the cosine of every text with its golden row, top-1 neighbour and
  recall@10 agreement (``checkpoint.output_agreement``, which Jetson bundles ship);
* ``labels`` (texts, labels): arg-max label agreement and the cosine of each text's logits;
* ``tensor`` (any rank): the cosine of each sample (first axis) flattened;

and every kind by its scale: each text's relative error ``|new - old| / |old|``, so outputs grown
1000-fold (cosine 1, the same neighbours) fail. A text *moved* when its cosine is below
``min_cosine`` or its relative error above ``max_rel_error``; the verdict names the outputs and the
texts that moved most (lowest cosine first), so a TensorRT or JetPack upgrade that breaks 5% of
texts fails by name even when the mean cosine still looks perfect. A NaN or inf on either side
fails its output, naming which side holds how many. Pure numpy: no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from attn_export.checkpoint.output_agreement import KINDS, describe_row, failure_verb, judge_rows
from attn_export.errors import DataError

__all__ = ["OUTPUT_KINDS", "GoldenThresholds", "OutputVerdict", "GoldenVerdict", "judge_golden", "kind_for"]

OUTPUT_KINDS = KINDS
WORST_SHOWN = 5


@dataclass(frozen=True)
class GoldenThresholds:
    """What a new stack must keep of the golden outputs. The golden is the same artifact on the old
    stack, so the floors are tight: a rounding change passes, a miscompiled kernel does not."""

    min_cosine: float = 0.995  # every text, every output
    min_top1: float = 0.95  # embedding: fraction of texts with the same nearest neighbour
    min_recall_at_10: float = 0.95
    min_label_agreement: float = 0.99
    max_rel_error: float = 0.1  # every text: |new - old| / |old| (L2), the scale the cosine cannot see


@dataclass
class OutputVerdict:
    name: str
    kind: str
    metrics: dict[str, float]
    failures: list[str]
    worst: list[tuple[int, float, float]]  # (text index, cosine, relative error; inf: not finite), lowest cosine first

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class GoldenVerdict:
    outputs: list[OutputVerdict] = field(default_factory=list)
    texts: list[str] | None = None

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)

    def text_name(self, index: int) -> str:
        if self.texts and index < len(self.texts):
            text = self.texts[index]
            return f"text {index} {text[:60]!r}{'...' if len(text) > 60 else ''}"
        return f"text {index}"

    def failure_lines(self) -> list[str]:
        """One line per failed output: what moved, and the texts that moved most."""
        lines = []
        for o in self.outputs:
            if o.failures:
                worst = "; ".join(f"{self.text_name(i)} {describe_row(c, r)}" for i, c, r in o.worst[:WORST_SHOWN])
                more = f" (+{len(o.worst) - WORST_SHOWN} more)" if len(o.worst) > WORST_SHOWN else ""
                head = f"output {o.name!r} ({o.kind}) {failure_verb(o.metrics)}: {', '.join(o.failures)}"
                lines.append(head + (f"; moved most: {worst}{more}" if worst else ""))
        return lines


def kind_for(shape: Sequence[int], labels: bool = False) -> str:
    """The default kind of an output: logits named by the user are labels, (texts, dim) an embedding."""
    if labels:
        return "labels"
    return "embedding" if len(shape) == 2 else "tensor"


def _rows(batches: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(b, dtype=np.float64).reshape(len(b), -1) for b in batches], axis=0)


def _judge_output(name: str, kind: str, old: np.ndarray, new: np.ndarray, t: GoldenThresholds) -> OutputVerdict:
    try:
        metrics, failures, worst = judge_rows(kind, old, new, asdict(t))  # the arithmetic the Jetson bundle ships too
    except ValueError as err:  # no texts, or a threshold that is not a finite number
        raise DataError(f"output {name!r} cannot be judged against the golden ({err}); record it again") from None
    return OutputVerdict(name, kind, metrics, failures, worst)


def judge_golden(old: Mapping[str, Sequence[np.ndarray]], new: Mapping[str, Sequence[np.ndarray]], kinds: Mapping[str, str],
                 thresholds: GoldenThresholds | None = None, texts: list[str] | None = None) -> GoldenVerdict:  # fmt: skip
    """Judge ``new`` (output name -> one array per batch) against ``old`` (the golden), output by output."""
    t = thresholds or GoldenThresholds()
    missing = sorted(set(old) - set(new))
    if missing:
        raise DataError(f"the artifact does not produce the golden outputs {missing}; check it against the golden of the same model")
    verdict = GoldenVerdict(texts=texts)
    for name in old:
        a, b = _rows(old[name]), _rows(new[name])
        if a.shape != b.shape:
            raise DataError(f"output {name!r} has shape {b.shape} per text, the golden {a.shape}; the inputs or the model differ")
        kind = kinds.get(name, "tensor")
        if kind not in OUTPUT_KINDS:
            raise DataError(f"output {name!r} has judge kind {kind!r}; expected one of {list(OUTPUT_KINDS)}")
        verdict.outputs.append(_judge_output(name, kind, a, b, t))
    return verdict
