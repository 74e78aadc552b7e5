"""CPU classes from real /proc/cpuinfo lines, the report's environment, and the process context."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attn_export.host.environment import capture_environment, classify, detect_cpu, package_versions, parse_cpu_flags

EPYC_AVX2 = "model name\t: AMD EPYC 7763 64-Core Processor\nflags\t\t: fpu sse4_1 sse4_2 avx avx2 fma bmi2\n"
ICELAKE = "model name\t: Intel Xeon Platinum 8375C\nflags\t\t: avx2 avx512f avx512bw avx512vl avx512_vnni\n"
SAPPHIRE = "model name\t: Intel Xeon 8480+\nflags\t\t: avx2 avx512f avx512bw avx512_vnni avx_vnni amx_tile amx_int8\n"
SKYLAKE = "model name\t: Intel Xeon Gold 6148\nflags\t\t: avx2 avx512f avx512bw avx512cd\n"
JETSON = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp\n"


@pytest.mark.parametrize(
    "text,machine,isa,saturates",
    [(EPYC_AVX2, "x86_64", "x86-avx2", True), (ICELAKE, "x86_64", "x86-avx512-vnni", False), (SAPPHIRE, "x86_64", "x86-amx", False),
     (SKYLAKE, "x86_64", "x86-avx512", True), (JETSON, "aarch64", "arm-dotprod", False)],
)  # fmt: skip
def test_cpu_classes(tmp_path, monkeypatch, text, machine, isa, saturates):
    flags, model = parse_cpu_flags(text)
    assert classify(machine, flags) == isa
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    monkeypatch.setattr("platform.machine", lambda: machine)
    monkeypatch.delenv("ATTN_EXPORT_ISA_CLASS", raising=False)
    cpu = detect_cpu(path)
    assert cpu.isa_class == isa and cpu.u8s8_saturates is saturates
    assert (cpu.model == model) or not model


def test_environment_records_the_cpu_class_and_process_settings():
    env = capture_environment(2, {"threads": 2, "flush_denormals": True})
    assert env["cpu"]["isa_class"] == detect_cpu().isa_class and "u8s8_saturates" in env["cpu"]
    assert env["process"] == {"threads": 2, "flush_denormals": True} and env["onnxruntime"]


@pytest.mark.parametrize("provides", [["onnxruntime-gpu"], ["onnxruntime"], []])
def test_onnxruntime_is_recorded_under_the_distribution_that_provides_its_module(monkeypatch, provides):
    """The GPU wheel is another distribution with the same module: a run on it records its version, not None."""
    from importlib import metadata

    import attn_export.host.environment as environment

    versions = {"onnxruntime-gpu": "1.22.0", "onnxruntime": "1.21.1"}
    monkeypatch.setattr(metadata, "packages_distributions", lambda: {"onnxruntime": provides, "numpy": ["numpy"]})
    real_version = metadata.version
    monkeypatch.setattr(metadata, "version", lambda d: versions[d] if d in versions else real_version(d))
    environment._onnxruntime_distribution.cache_clear()
    try:
        got = package_versions()
        assert got["onnxruntime"] == (versions[provides[0]] if provides else None)
        assert got["onnxruntime_distribution"] == (provides[0] if provides else None)
        assert capture_environment(1)["onnxruntime"] == got["onnxruntime"]
    finally:
        environment._onnxruntime_distribution.cache_clear()


def test_run_json_and_the_report_record_the_same_versions(tmp_path):
    """One capture: the manifest's versions are the report environment's versions."""
    import json

    from attn_export.outdir.claim import claim

    with claim(tmp_path / "out"):
        pass
    recorded = json.loads((tmp_path / "out" / "run.json").read_text())["versions"]
    env = capture_environment(1)
    assert recorded == {k: env[k] for k in recorded} and recorded.keys() == package_versions().keys()


def test_an_emulated_class_is_refused_when_unknown(monkeypatch):
    from attn_export.errors import ConfigError

    monkeypatch.setenv("ATTN_EXPORT_ISA_CLASS", "x86-avx3")
    with pytest.raises(ConfigError, match="ATTN_EXPORT_ISA_CLASS"):
        detect_cpu()


def test_process_context_restores_threads_and_denormals():
    from attn_export.host.process import ProcessSettings, current_settings, process_settings

    before = torch.get_num_threads()
    torch.set_flush_denormal(False)  # a known start: an ONNX Runtime session made earlier on this thread may have set FTZ
    tiny = torch.tensor([1e-40], dtype=torch.float32)
    assert (tiny * 1.0).item() != 0.0  # denormals kept
    with process_settings(ProcessSettings(threads=1)) as record:
        assert torch.get_num_threads() == 1 and record["threads"] == 1 and record["flush_denormals"]
        assert current_settings()["threads"] == 1
        assert (tiny * 1.0).item() == 0.0  # flushed inside the run
    assert torch.get_num_threads() == before and current_settings() is None
    assert (tiny * 1.0).item() != 0.0


def test_every_runner_refuses_a_feed_without_the_mask():
    """EagerRunner used to drop a missing key_padding_mask silently and return unmasked output."""
    from attn_export.errors import ConfigError
    from attn_export.layers import MaskedLayer, build_layer
    from attn_export.runtime import EagerRunner

    layer = MaskedLayer(build_layer("self-attention", 32, 4, mask="padding"), "padding")
    runner = EagerRunner(layer, layer.input_names)
    x = np.zeros((1, 4, 32), np.float32)
    with pytest.raises(ConfigError, match=r"missing inputs \['key_padding_mask'\]"):
        runner.infer({"x": x})
    with pytest.raises(ConfigError, match=r"unexpected inputs \['mask'\]"):
        runner.infer({"x": x, "key_padding_mask": np.ones((1, 4), np.int32), "mask": x})
