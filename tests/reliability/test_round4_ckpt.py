"""Round four, hostile checkpoint folders (issue 28): links out of the folder, files that disagree with
each other, oversized files, damaged weights and devices under a file's name.

Each checkpoint is a tiny random-init BERT saved by transformers (safetensors) with a word-level
``tokenizer.json`` built by ``tokenizers``, then made hostile in one way. The CLI cases run in one
subprocess (``run_cli_batch``: a run that blocks on a FIFO fails its case instead of hanging the suite);
each must end in exit 2 and one ``attn-export: error:`` line naming the problem, with nothing written.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rel_helpers import REPO, Outcome, assert_one_line_error, assert_refused, run_cli_batch

RUN = ["--max-len", "32", "--repeats", "1", "--warmup", "0", "--batch", "2", "--seq-len", "16", "--max-texts", "16", "--threads", "1"]
VOCAB = 100  # config.json vocab_size of every checkpoint here
SIZES = dict(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64)
SPECIALS = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}


def _model(task: str | None = None, **config: object):  # type: ignore[no-untyped-def]
    import torch
    import transformers as T

    torch.manual_seed(0)
    cls = T.BertForSequenceClassification if task == "sequence" else T.BertModel
    return cls(T.BertConfig(**{**SIZES, **config})).eval()


def _words(n: int) -> dict[str, int]:
    """Ids 4..n-1: filler words, then the fidelity probe texts' words last, so real text reaches the highest ids."""
    from attn_export.checkpoint.fidelity import PROBE_TEXTS

    probe = list(dict.fromkeys(w for text in PROBE_TEXTS for w in text.split()))
    room = n - len(SPECIALS)
    words = [f"w{i}" for i in range(max(0, room - len(probe)))] + probe
    return {w: i + len(SPECIALS) for i, w in enumerate(words[:room])}


def _tokenizer(folder: Path, n: int = VOCAB, unk_id: int = 1, added: tuple[str, ...] = ()) -> Path:
    """A word-level BERT-style tokenizer.json of ``n`` tokens; ``[UNK]`` at ``unk_id``; ``added`` special tokens after them."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {**SPECIALS, "[UNK]": unk_id, **_words(n)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    if added:
        tok.add_special_tokens(list(added))
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def checkpoint(folder: Path, model=None, **tokenizer: object) -> Path:  # type: ignore[no-untyped-def]
    """A tiny BERT checkpoint saved by transformers (safetensors), with a tokenizer.json that fits it."""
    folder.mkdir(parents=True, exist_ok=True)
    (model if model is not None else _model()).save_pretrained(str(folder))
    _tokenizer(folder, **tokenizer)  # type: ignore[arg-type]
    return folder


def _link_out(name: str) -> Callable[[Path], Path]:
    """The checkpoint's ``name`` moved out of the folder and replaced by a symlink to it."""

    def build(t: Path) -> Path:
        ck = checkpoint(t / "ck")
        outside = t / "outside"
        outside.mkdir()
        src, moved = ck / name, outside / Path(name).name
        if not src.exists():
            src.parent.mkdir(exist_ok=True)
            src.write_text('{"do_lower_case": true}' if name.endswith(".json") else "[PAD]\n[UNK]\n", encoding="utf-8")
        shutil.move(src, moved)
        src.symlink_to(moved)
        return ck

    return build


def _nan_weights(value: float) -> Callable[[Path], Path]:
    def build(t: Path) -> Path:
        import torch

        model = _model()
        with torch.no_grad():
            model.encoder.layer[1].attention.self.query.weight[3, 5] = value
        return checkpoint(t / "ck", model)

    return build


def _id2label_list(t: Path) -> Path:
    ck = checkpoint(t / "ck", _model("sequence", num_labels=3))
    cfg = json.loads((ck / "config.json").read_text())
    cfg["id2label"] = ["negative", "neutral", "positive"]
    (ck / "config.json").write_text(json.dumps(cfg))
    return ck


def _fifo_tokenizer(t: Path) -> Path:
    ck = checkpoint(t / "ck")
    (ck / "tokenizer.json").unlink()
    os.mkfifo(ck / "tokenizer.json")
    return ck


def _device_tokenizer(t: Path) -> Path:
    ck = checkpoint(t / "ck")
    (ck / "tokenizer.json").unlink()
    (ck / "tokenizer.json").symlink_to("/dev/zero")
    return ck


# case id -> (builder, text the one line must contain)
CASES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "c05-tokenizer-json-links-out-of-the-folder": (_link_out("tokenizer.json"), "inside the checkpoint directory"),
    "c22-tokenizer-of-1000-tokens-on-a-vocab-100-model": (lambda t: checkpoint(t / "ck", n=1000), "expected token ids < 100"),
    "c22-unk-token-at-id-40000": (lambda t: checkpoint(t / "ck", unk_id=40000), "got id 40000 ('[UNK]'"),
    "c22-added-tokens-beyond-the-vocabulary": (lambda t: checkpoint(t / "ck", added=("[E1]", "[E2]")), "an added token"),
    "c22-id2label-is-a-list": (_id2label_list, "id2label: expected an object"),
    "c29-nan-in-the-weights": (_nan_weights(float("nan")), "tensor encoder.layer.1.attention.self.query.weight holds NaN/inf values"),
    "c29-inf-in-the-weights": (_nan_weights(float("inf")), "holds NaN/inf values; the checkpoint is damaged: re-save it from a finite model"),
    "c29-tokenizer-json-is-a-fifo": (_fifo_tokenizer, "tokenizer.json is a FIFO (named pipe), not a regular file"),
    "c29-tokenizer-json-is-dev-zero": (_device_tokenizer, "tokenizer.json is a character device, not a regular file"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Outcome, Path]]:
    """Every CLI case, run in one subprocess (each in its own folder, --out inside it)."""
    runs: dict[str, tuple[list[object], Path]] = {}
    for cid, (build, _expect) in CASES.items():
        t = tmp_path_factory.mktemp(cid[:3])
        ck = build(t)
        runs[cid] = (["--checkpoint", ck, "--out", t / "out", "--quiet", *RUN], t)
    results = run_cli_batch(runs, timeout=600)
    return {cid: (results[cid], runs[cid][1]) for cid in CASES}


@pytest.mark.parametrize("cid", list(CASES), ids=list(CASES))
def test_hostile_checkpoint_is_refused_in_one_line(cid: str, outcomes: dict[str, tuple[Outcome, Path]]) -> None:
    outcome, _folder = outcomes[cid]
    assert_refused(outcome, CASES[cid][1], max_seconds=120)  # the NaN cases read the weights: refused at load


def test_c29_nan_weights_are_not_reported_as_a_fidelity_failure(outcomes: dict[str, tuple[Outcome, Path]]) -> None:
    """NaN weights were reported as "does not reproduce transformers ... report this config.json as an issue"."""
    err = outcomes["c29-nan-in-the-weights"][0].err
    assert "does not reproduce" not in err and "report this" not in err, err
    assert "model.safetensors: tensor" in err, err


# -- library level: every file transformers or sentence-transformers opens by name stays inside ------------
@pytest.mark.parametrize("name", ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "model.safetensors",
                                  "README.md", "2_Dense/config.json"], ids=lambda n: f"c05-{n.replace('/', '-')}-links-out")  # fmt: skip
def test_c05_every_file_a_library_opens_must_resolve_inside_the_folder(name: str, tmp_path: Path) -> None:
    from attn_export.checkpoint.config_file import read_checkpoint_config
    from attn_export.errors import CheckpointError

    ck = _link_out(name)(tmp_path)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_config(ck)  # what flag validation reads: refused before any model is built
    assert_one_line_error(err.value, CheckpointError, f"{name}: checkpoint file: expected a file inside the checkpoint directory")


def test_c05_load_tokenizer_refuses_a_link_out_on_its_own(tmp_path: Path) -> None:
    from attn_export.checkpoint.text import load_tokenizer
    from attn_export.errors import CheckpointError

    ck = _link_out("tokenizer.json")(tmp_path)
    with pytest.raises(CheckpointError) as err:
        load_tokenizer(ck)
    assert_one_line_error(err.value, CheckpointError, "copy the file into the checkpoint directory")


def test_c05_a_hugging_face_cache_snapshot_still_loads(tmp_path: Path) -> None:
    """The one allowed way out: ``<repo>/snapshots/<rev>/`` files are links into ``<repo>/blobs/``."""
    from attn_export.checkpoint.config_file import read_checkpoint_config
    from attn_export.checkpoint.text import load_tokenizer

    built = checkpoint(tmp_path / "built")
    snap, blobs = tmp_path / "models--x" / "snapshots" / "abc", tmp_path / "models--x" / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in built.iterdir():
        shutil.move(f, blobs / f.name)
        (snap / f.name).symlink_to(Path("../../blobs") / f.name)
    assert read_checkpoint_config(snap)[1].vocab_size == VOCAB
    assert load_tokenizer(snap, VOCAB).get_vocab_size() == VOCAB


# -- c22/c06: files read whole are sized (fstat) before they are read ------------------------------------
def _sparse(path: Path, size: int) -> None:
    with path.open("wb") as f:
        f.truncate(size)  # a sparse file: no disk blocks, and nothing is read to size it


@pytest.mark.parametrize("name", ["tokenizer_config.json", "modules.json", "tokenizer.json"], ids=lambda n: f"c22-4GiB-{n}")
def test_c22_an_oversized_json_is_refused_from_its_size(name: str, tmp_path: Path) -> None:
    from attn_export.checkpoint.config_file import read_checkpoint_config
    from attn_export.errors import CheckpointError

    ck = checkpoint(tmp_path / "ck")
    _sparse(ck / name, 4 * 2**30)
    with pytest.raises(CheckpointError) as err:
        read_checkpoint_config(ck)
    assert_one_line_error(err.value, CheckpointError, f"{name} is far smaller), got 4,294,967,296")


def test_c22_a_4GiB_config_json_under_a_3GiB_address_space_is_one_line(tmp_path: Path) -> None:
    """The issue's reproduction: ``ulimit -v 3000000`` and a 4 GiB config.json ended in MemoryError."""
    ck = checkpoint(tmp_path / "ck")
    _sparse(ck / "config.json", 4 * 2**30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))

    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "attn_export.cli", "--checkpoint", str(ck), "--out", str(tmp_path / "out"), *RUN],  # noqa: S603
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, preexec_fn=cap)  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("attn-export: error:"), lines
    assert "config.json: expected at most" in lines[0] and "got 4,294,967,296" in lines[0], lines[0]
    assert not (tmp_path / "out").exists()


def test_c22_read_json_sizes_the_file_before_reading_it(tmp_path: Path) -> None:
    from attn_export.errors import DataError
    from attn_export.validate.schema import read_json

    path = tmp_path / "report.json"
    _sparse(path, 2**40)  # 1 TiB: reading it would never end
    with pytest.raises(DataError) as err:
        read_json(path, "a report", "regenerate it")
    assert_one_line_error(err.value, DataError, "got 1,099,511,627,776")
