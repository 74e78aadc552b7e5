"""Round four, flags and values: tolerance flags that were dropped without a word (c24), and values
that were accepted unbounded, ended in a traceback or were refused in internal names (c29, c27).

* c24: ``--atol z:1e-9`` (no output z), ``--atol Y:0`` (the output is ``y``), ``--atol a:b:1e-9``
  (malformed) each passed on the default bars; so did ``--rtol 0`` on a checkpoint (its judge
  ignored rtol) and ``--atol logits:0 --cosine-min logits:1`` on a token classifier (its judge
  ignored every bar on logits). A name that is no judged output is now refused in one line listing
  the outputs, before any work, and a bar the judge uses is applied: the tight bars fail the run.
* c29: a baseline cosine of 1.5 was accepted (and every report a "regression" against it);
  ``--int8-fallback ²`` ended in ``int()``'s traceback; ``--pooling`` with 20,001 modes ran for
  minutes; bench's comma lists took any number of repeats; ``--seq-len 1`` on a checkpoint was
  refused as ``max_len``/``pad_to``.
* c27: ``sweep --quick --low-rank 0.5`` ended in ``SweepConfig() got multiple values``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures import wordpiece_tokenizer
from rel_helpers import TINY, assert_refused, good_report, run_cli, write_json

from attn_export.validate.gate.check import make_baseline

# The smallest checkpoint run: 8 texts per split, short sequences, one thread.
CKPT_RUN = ["--max-len", "32", "--seq-len", "16", "--batch", "2", "--max-texts", "8", "--repeats", "1", "--warmup", "0", "--threads", "1",
            "--encoder-form", "padded"]  # fmt: skip


# -- tiny checkpoints saved by transformers, with a WordPiece tokenizer trained on the shipped corpus -------
def _checkpoint(folder: Path, model_cls: str, **extra: object) -> Path:
    transformers = pytest.importorskip("transformers", reason="the reference is transformers' own model: pip install transformers")
    import torch

    folder.mkdir(parents=True)
    vocab = wordpiece_tokenizer(folder)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64,
                                     max_position_embeddings=64, **extra)  # fmt: skip
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "classifier" in name:
                p.mul_(20.0)  # logits of a few units, not ~1e-2: their bars mean something
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def bare_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("bare") / "bert", "BertModel")


@pytest.fixture(scope="module")
def token_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("token") / "bert-token", "BertForTokenClassification", num_labels=5)


# -- c24: tolerance flags -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "flags, expect",
    [
        pytest.param(["--atol", "z:1e-9"], "got z:1e-09 (the transformer layer has the outputs y); use --atol y:1e-09", id="c24-atol-names-no-output"),
        pytest.param(["--atol", "Y:0"], "got Y:0 (the transformer layer has the outputs y)", id="c24-atol-output-in-the-wrong-case"),
        pytest.param(["--cosine-min", "out:0.5"], "--cosine-min OUTPUT:VALUE to name an output", id="c24-cosine-min-names-no-output"),
        pytest.param(["--atol", "a:b:1e-9"], "expected --atol VALUE or OUTPUT:VALUE, got 'a:b:1e-9'", id="c24-atol-with-two-names-is-malformed"),
        pytest.param(["--rtol", ":1e-3"], "expected --rtol VALUE or OUTPUT:VALUE, got ':1e-3'", id="c24-rtol-with-an-empty-name-is-malformed"),
    ],
)
def test_c24_a_layer_tolerance_flag_naming_no_output_is_refused(flags, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused(run_cli([*TINY, *flags, "--out", tmp_path / "out"], capsys, tmp_path), expect)


@pytest.mark.parametrize(
    "model, flags, expect",
    [
        pytest.param("bare", ["--atol", "logits:0"], "--checkpoint {ckpt} has the outputs sentence_embedding); use --atol sentence_embedding:0",
                     id="c24-atol-logits-on-a-bare-encoder"),
        pytest.param("bare", ["--rtol", "last_hidden_state:0"], "last_hidden_state is exported but not judged", id="c24-rtol-on-the-unjudged-hidden-states"),
        pytest.param("bare", ["--layers", "0", "--atol", "y:1e-3"], "y is exported but not judged", id="c24-atol-y-on-a-layer-judged-in-context"),
        pytest.param("token", ["--cosine-min", "logit:1"], "--checkpoint {ckpt} has the outputs logits); use --cosine-min logits:1",
                     id="c24-cosine-min-misspelt-on-a-token-head"),
        pytest.param("token", ["--atol", "sentence_embedding:1e-3"], "sentence_embedding is exported but not judged; --checkpoint {ckpt} is judged on logits",
                     id="c24-atol-on-a-token-heads-unread-pooled-embedding"),
    ],
)  # fmt: skip
def test_c24_a_checkpoint_tolerance_flag_naming_no_judged_output_is_refused(model, flags, expect, bare_bert, token_bert, tmp_path, capsys):
    """The outputs are known from config.json (and the weights' key names), before the model is built or --out written."""
    ckpt = {"bare": bare_bert, "token": token_bert}[model]
    o = run_cli(["--checkpoint", ckpt, *CKPT_RUN, *flags, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, expect.format(ckpt=ckpt))


def test_c24_tight_bars_on_a_token_classifier_are_applied_and_fail_the_run(token_bert, tmp_path, capsys):
    """``--rtol 0`` (every output) and ``--atol logits:0 --cosine-min logits:1`` were dropped: PASS on the default bars.
    Now the report's bar carries them and the fp32 route, which meets every default bar, fails on them alone. A token
    classifier is judged on its logits only (what its users read): no bar on its pooled embedding."""
    out = tmp_path / "out"
    o = run_cli(["--checkpoint", token_bert, *CKPT_RUN, "--rtol", "0", "--atol", "logits:0", "--cosine-min", "logits:1", "--out", out, "-q"], capsys, tmp_path)
    assert o.code == 1, (o.code, o.err)
    stage = next(s for s in json.loads((out / "report.json").read_text())["stages"] if s["name"] == "onnx-fp32")
    bar = stage["tolerance"]
    assert bar == {"logit_min_label_agreement": 1.0, "logit_min_mean_cosine": 1, "logit_max_abs": 0, "logit_max_rel_l2": 0}, bar
    violations = stage["details"]["violations"]
    assert not stage["passed"] and any(v.startswith("logit rel_l2 ") for v in violations) and any(v.startswith("logit max_abs ") for v in violations)
    user_bars = ("logit rel_l2 ", "logit max_abs ", "logit mean cosine ")
    assert all(v.startswith(user_bars) for v in violations), violations  # every default bar is met: the user's bars decide


# -- c29: baseline values outside their metric's range ------------------------------------------------------
@pytest.mark.parametrize(
    "metric, value, expect",
    [
        pytest.param("cosine", 1.5, "value: expected a number in [-1, 1] (the range of cosine), got 1.5", id="c29-baseline-cosine-1.5"),
        pytest.param("cosine", -3.0, "(the range of cosine), got -3.0", id="c29-baseline-cosine-below-minus-1"),
        pytest.param("rel_l2", -0.01, "expected a number >= 0 (the range of rel_l2), got -0.01", id="c29-baseline-negative-rel-l2"),
    ],
)
def test_c29_a_baseline_value_outside_its_metrics_range_is_refused(metric, value, expect, tmp_path, capsys):
    report = good_report()
    base = make_baseline(report)
    entry = next(iter(base["classes"].values()))["stages"]["onnx-fp32"]["metrics"]
    entry[metric]["value"] = value
    o = run_cli(["check", write_json(tmp_path / "r.json", report), "--baseline", write_json(tmp_path / "b.json", base)], capsys, tmp_path)
    assert_refused(o, expect)
    assert "stages.onnx-fp32.metrics." + metric in o.err


# -- c29: integers in Unicode digits ----------------------------------------------------------------------
@pytest.mark.parametrize("value", [pytest.param("²", id="c29-int8-fallback-superscript-two"), pytest.param("①", id="c29-int8-fallback-circled-one"),
                                   pytest.param("³", id="c29-int8-fallback-superscript-three"), pytest.param("١", id="c29-int8-fallback-arabic-indic-one")])  # fmt: skip
def test_c29_int8_fallback_takes_ascii_digits_only(value, tmp_path, capsys, monkeypatch):
    """``str.isdigit()`` is true of '²' and '①', which ``int()`` refuses (a traceback); '١' it read as 1."""
    monkeypatch.chdir(tmp_path)
    o = run_cli([*TINY, "--quantize", "int8", "--int8-fallback", value, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "expected --int8-fallback auto|none|N (N in ASCII digits)")


def test_c29_checkpoint_layers_and_bench_lists_take_ascii_digits_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused(run_cli(["--checkpoint", "minilm", "--layers", "١", "--out", tmp_path / "o"], capsys, tmp_path), "--layers all or a layer index N")
    assert_refused(run_cli(["bench", "--seqs", "8,²", "--out", tmp_path / "b"], capsys, tmp_path), "--seqs as comma-separated integers")


# -- c29: value lists that multiply work --------------------------------------------------------------------
def test_c29_pooling_with_20001_modes_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    modes = "+".join(["cls", "mean"] * 10000 + ["max"])
    o = run_cli(["--checkpoint", "minilm", "--pooling", modes, "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "expected each --pooling mode once (at most 6), got cls 10000 times; drop the repeats, e.g. --pooling cls+mean+max")
    assert len(o.err) < 400


@pytest.mark.parametrize(
    "argv, expect",
    [
        pytest.param(["--checkpoint", "minilm", "--pooling", "mean+mean"], "expected each --pooling mode once", id="c29-pooling-mode-twice"),
        pytest.param(["--low-rank", "0.5", "--low-rank-targets", "q,k,q"], "expected each --low-rank-targets value once", id="c29-low-rank-target-twice"),
        pytest.param(["--checkpoint", "minilm", "--languages", "en,de,en"], "expected each --languages value once", id="c29-language-twice"),
        pytest.param(["sweep", "--low-rank", "0.5,none,0.5"], "expected each --low-rank value once, got 0.5 2 times; use --low-rank 0.5,none",
                     id="c29-sweep-axis-value-twice"),
        pytest.param(["bench", "--seqs", "128,128"], "expected each --seqs value once, got 128 2 times", id="c29-bench-seq-twice"),
        pytest.param(["bench", "--variants", "eager-fp32,eager-fp32"], "expected each --variants value once", id="c29-bench-variant-twice"),
        pytest.param(["bench", "--batches", ",".join(map(str, range(1, 2002)))], "expected at most 32 values in --batches", id="c29-bench-2001-batches"),
    ],
)  # fmt: skip
def test_c29_repeated_or_unbounded_list_values_are_refused(argv, expect, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused(run_cli([*argv, "--out", tmp_path / "out"], capsys, tmp_path), expect)


# -- c29: internal names in a message -----------------------------------------------------------------------
def test_c29_seq_len_1_on_a_checkpoint_names_the_users_flag(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    o = run_cli(["--checkpoint", "minilm", "--seq-len", "1", "--out", tmp_path / "out"], capsys, tmp_path)
    assert_refused(o, "expected --seq-len >= 2 for a --checkpoint")
    assert "max_len" not in o.err and "pad_to" not in o.err


# -- c27: sweep --quick with an axis flag --------------------------------------------------------------------
def test_c27_sweep_quick_composes_with_the_axis_flags(tmp_path, capsys, monkeypatch):
    """The user's axes override the quick preset's and the others stay the preset's (checked on the grid); then
    ``sweep --quick --low-rank 0.5`` runs through the CLI (its distillation and int8 axes narrowed to keep it short)."""
    from rel_inputs import calib_arrays, npz

    from attn_export.campaigns.sweep import SweepConfig

    keys = [p.key for p in SweepConfig.quick(low_rank=(0.5,), base={"d_model": 32, "heads": 4}).points()]
    assert keys == ["r0.5-fp32", "r0.5-dynamic", "r0.5-static-minmax", "r0.5-fp16", "r0.5-d40-fp32", "r0.5-d40-dynamic",
                    "r0.5-d40-static-minmax", "r0.5-d40-fp16"]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    calib = npz(tmp_path / "calib.npz", **calib_arrays())
    out = tmp_path / "sweep"
    o = run_cli(["sweep", "--quick", "--low-rank", "0.5", "--distill", "none", "--quantize", "none", *TINY, "--calib", calib, "--out", out, "-q"],
                capsys, tmp_path)  # fmt: skip
    assert o.code == 0, o.err
    result = json.loads((out / "sweep.json").read_text())
    assert [p["key"] for p in result["points"]] == ["r0.5-fp32", "r0.5-fp16"]
