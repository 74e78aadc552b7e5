"""attn-export fleet: refusals before work, a local run with its cache, and a simulated cluster placed by node labels.

All in the default suite (issue 32: the tests that need Ray run by default): the points are one tiny reference
layer, and one three-node Ray cluster serves the module (about 50 s in all, most of it Ray start-up and the
workers importing torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attn_export.campaigns.fleet.cache import Cache
from attn_export.campaigns.fleet.matrix import build_points
from attn_export.campaigns.fleet.schema import load_fleet
from attn_export.cli.fleet import main_command_config
from attn_export.errors import ConfigError

TINY = """
[fleet]
options = "--repeats 1 --warmup 0 --seq-len 8 --batch 1 --threads 1"
[[models]]
name = "layer32"
options = "--d-model 32 --heads 2"
[[recipes]]
name = "fp32"
{recipes}
{targets}
"""
CPU = '[[targets]]\nname = "cpu"\ntarget = "ort-cpu"\n'


def _write(tmp_path: Path, recipes: str = "", targets: str = CPU) -> Path:
    path = tmp_path / "FLEET.toml"
    path.write_text(TINY.format(recipes=recipes, targets=targets))
    return path


@pytest.mark.parametrize(("recipes", "targets", "needle"), [
    ('[[recipes]]\nname = "q"\noptions = "--quantise int8"\n', CPU, "No such option: --quantise"),
    ("", '[[targets]]\nname = "x"\ntarget = "ort-tpu"\n', "got 'ort-tpu'"),
    ('[[recipes]]\nname = "same"\noptions = "--precision fp32"\n', CPU, "duplicate point"),
    ('[[recipes]]\nname = "fp32"\n', CPU, "appears twice"),
    ("", CPU + "colour = 1\n", "Extra inputs are not permitted"),
])  # fmt: skip
def test_malformed_fleet_refused_in_one_line(tmp_path: Path, recipes: str, targets: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_points(load_fleet(_write(tmp_path, recipes, targets)), main_command_config)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_cli_refuses_before_work(tmp_path: Path) -> None:
    """exit 2, one line, before torch is imported and before anything is written."""
    from tests.test_fast_refusal import _refuse

    got = _refuse(["fleet", str(_write(tmp_path, '[[recipes]]\nname = "q"\noptions = "--quantise int8"\n'))])
    assert got["rc"] == 2 and got["heavy"] == [], got
    assert "No such option: --quantise" in got["stderr"] and len(got["stderr"].strip().splitlines()) == 1
    assert not (tmp_path / "fleet-out").exists() and not (tmp_path / ".attn-export-cache").exists()


def test_cache_lru_eviction_and_first_writer_wins(tmp_path: Path) -> None:
    cache = Cache(tmp_path, limit_bytes=2000)  # two entries (600 bytes and a record of ~150 each) fit, three do not
    for key in ("a", "b"):
        with cache.writing(key) as tmp:
            (tmp / "report.json").write_bytes(b"x" * 600)
    assert cache.get("a") is not None  # a used after b: b is the least recently used
    with cache.writing("a") as tmp:  # a second writer of the same key: the entry stays whole
        (tmp / "report.json").write_bytes(b"y" * 600)
    assert (cache.entry("a") / "report.json").read_bytes() == b"x" * 600
    with cache.writing("c") as tmp:
        (tmp / "report.json").write_bytes(b"z" * 600)
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None


def test_local_run_then_all_cache_hits(tmp_path: Path) -> None:
    from attn_export.campaigns.fleet.local import run_local

    spec = load_fleet(_write(tmp_path, '[[recipes]]\nname = "fp16"\noptions = "--precision fp16"\n'))
    points = build_points(spec, main_command_config)
    first = run_local(points, str(spec.fleet.cache), 2**30, lambda *a: None)
    assert {r["status"] for r in first.values()} == {"passed"}, first
    again = run_local(points, str(spec.fleet.cache), 2**30, lambda *a: None)
    assert {r["status"] for r in again.values()} == {"cached"}
    assert {k: r["built_on"] for k, r in again.items()} == {k: r["node"] for k, r in first.items()}
    assert {k: r["accuracy"] for k, r in again.items()} == {k: r["accuracy"] for k, r in first.items()}


GPU_TARGETS = CPU + """
[[targets]]
name = "orin"
target = "jetson"
labels = {sm = "87", jetpack = "6.2"}
[[targets]]
name = "h100"
target = "tensorrt"
trt = "10.14"
gpu_arch = "sm90"
labels = {sm = "90", trt = "10.14"}
"""


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "labels": {"role": "head"}})
    nodes = [c.add_node(num_cpus=1, labels={"sm": "87", "jetpack": "6.2"}), c.add_node(num_cpus=1, labels={"sm": "90", "trt": "10.14"})]
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
    yield c, nodes

    ray.shutdown()
    c.shutdown()


def test_cluster_places_points_by_labels(tmp_path: Path, cluster) -> None:
    from attn_export.campaigns.fleet.placement import check_cluster_has, matches
    from attn_export.campaigns.fleet.ray_exec import cluster_labels, run_ray

    spec = load_fleet(_write(tmp_path, targets=GPU_TARGETS))
    points = build_points(spec, main_command_config)
    check_cluster_has(points, cluster_labels())
    records = run_ray(points, str(spec.fleet.cache), 2**30, 2, lambda *a: None)
    for p in points:
        rec = records[p.key]
        assert rec["status"] == "passed", rec
        assert matches(p.labels, rec["labels"]), (p.key, rec)
        assert bool(rec.get("stand_in")) == bool(p.labels)  # GPU points: the honest stand-in, not an engine
    with pytest.raises(ConfigError, match="no node of the cluster has"):
        check_cluster_has(build_points(load_fleet(_write(tmp_path, targets=GPU_TARGETS.replace('"6.2"', '"7.2"'))), main_command_config), cluster_labels())
    json.dumps(records)


def test_a_dead_node_is_retried_elsewhere_and_a_rerun_resumes_from_the_cache(tmp_path: Path, cluster) -> None:
    """Two Orin nodes; one is killed while the matrix runs: its point is retried on the other, every point completes."""
    import threading
    import time

    from attn_export.campaigns.fleet.ray_exec import run_ray

    c, _ = cluster
    doomed = c.add_node(num_cpus=1, labels={"sm": "87", "jetpack": "6.2", "spare": "yes"})
    orin_only = '[[targets]]\nname = "orin"\ntarget = "jetson"\nlabels = {sm = "87", jetpack = "6.2"}\n'
    spec = load_fleet(_write(tmp_path, '[[recipes]]\nname = "fp16"\noptions = "--precision fp16"\n', orin_only))
    points = build_points(spec, main_command_config)
    started_on: list[str] = []
    out: dict = {}
    track = lambda key, status, rec: started_on.append(rec["node"]) if status == "running" else None  # noqa: E731
    worker = threading.Thread(target=lambda: out.update(run_ray(points, str(spec.fleet.cache), 2**30, 2, track)))
    worker.start()
    deadline = time.monotonic() + 120
    while doomed.node_id[:12] not in started_on and time.monotonic() < deadline:
        time.sleep(0.2)
    assert doomed.node_id[:12] in started_on, started_on  # a point is running there (a fresh worker imports torch first)
    c.remove_node(doomed, allow_graceful=False)
    worker.join(timeout=240)
    assert not worker.is_alive()
    assert {r["status"] for r in out.values()} == {"passed"}, out
    assert all(r["node"] != doomed.node_id[:12] for r in out.values())
    again = run_ray(points, str(spec.fleet.cache), 2**30, 2, lambda *a: None)
    assert {r["status"] for r in again.values()} == {"cached"}
    assert {k: r["built_on"] for k, r in again.items()} == {k: r["node"] for k, r in out.items()}


def test_local_run_lists_points_that_need_labelled_nodes(tmp_path: Path) -> None:
    from attn_export.campaigns.fleet.local import run_local

    spec = load_fleet(_write(tmp_path, targets=GPU_TARGETS.replace(CPU, "")))
    records = run_local(build_points(spec, main_command_config), str(tmp_path / "cache"), 2**20, lambda *a: None)
    assert {r["status"] for r in records.values()} == {"needs-node"}
    assert "sm=87, jetpack=6.2" in records["layer32/fp32/orin"]["reason"]


def test_fleet_out_has_one_report_a_front_per_target_and_each_point_folder(tmp_path: Path) -> None:
    from attn_export.campaigns.fleet.result import fleet_result, write_fleet

    points = build_points(load_fleet(_write(tmp_path, '[[recipes]]\nname = "fp16"\noptions = "--precision fp16"\n')), main_command_config)
    folder = tmp_path / "entry"
    folder.mkdir()
    (folder / "report.md").write_text("# report\n")
    rec = {"status": "passed", "node": "n1", "folder": str(folder), "size_bytes": 1000, "stand_in": None}
    records = {points[0].key: {**rec, "accuracy": {"cosine": 1.0, "sqnr_db": 80.0}, "latency_ms": 2.0},
               points[1].key: {**rec, "accuracy": {"cosine": 0.99, "sqnr_db": 40.0}, "latency_ms": 3.0}}  # slower and worse: off the front
    result = fleet_result(points, records)
    assert result["pareto"] == {"cpu": [points[0].key]}
    write_fleet(result, tmp_path / "out")
    assert (tmp_path / "out" / "points" / points[1].key / "report.md").is_file()
    assert "| layer32/fp16/cpu | passed | n1 |" in (tmp_path / "out" / "fleet.md").read_text()
    write_fleet(result, tmp_path / "out")  # again: our own earlier files are replaced
    assert (tmp_path / "out" / "points" / points[1].key / "report.md").is_file()


def test_a_fleet_out_holding_the_users_files_is_refused_before_work(tmp_path: Path) -> None:
    """One line, exit 2, before torch: the user's file is neither overwritten nor deleted."""
    from tests.test_fast_refusal import _refuse

    out = tmp_path / "fleet-out"
    out.mkdir()
    (out / "fleet.md").write_text("my notes\n")
    got = _refuse(["fleet", str(_write(tmp_path)), "--out", str(out)])
    assert got["rc"] == 2 and got["heavy"] == [], got
    assert "'fleet.md'" in got["stderr"] and "which attn-export did not write" in got["stderr"], got
    assert (out / "fleet.md").read_text() == "my notes\n"


def test_triton_config_selects_the_engine_per_compute_capability() -> None:
    from attn_export.deploy.triton_cc import cc_config

    text = cc_config("enc", {"87": "model.sm87.plan", "sm90": "model.sm90.plan"})
    assert 'platform: "tensorrt_plan"' in text
    assert 'key: "8.7"' in text and 'value: "model.sm87.plan"' in text and 'key: "9.0"' in text


def test_a_changed_recipe_changes_only_its_points_keys(tmp_path: Path) -> None:
    def keys(fp16_options: str) -> dict[str, str]:
        spec = load_fleet(_write(tmp_path, f'[[recipes]]\nname = "half"\noptions = "{fp16_options}"\n'))
        return {p.key: p.cache_key for p in build_points(spec, main_command_config)}

    before, after = keys("--precision fp16"), keys("--precision fp16 --opset 18")
    assert before["layer32/fp32/cpu"] == after["layer32/fp32/cpu"]
    assert before["layer32/half/cpu"] != after["layer32/half/cpu"]


def test_triton_cc_config_holds_for_every_engines_profiles(tmp_path: Path) -> None:
    """One config for the Orin and the H100 engine: the smaller max batch, the profiles both have; round-trips."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    from attn_export.deploy.triton_cc import write_cc_repository
    from attn_export.runtime.tensorrt.sidecar import EngineSidecar, write_sidecar

    def engine(name: str, profiles: list[tuple[int, int]]) -> Path:
        path = tmp_path / name
        path.write_bytes(b"plan")
        shapes = [{"input_ids": {"min": [1, 1], "opt": [b, s], "max": [b, s]}} for b, s in profiles]
        write_sidecar(path, EngineSidecar(
            tensorrt_version="10.14.1", gpu_name=name, compute_capability="8.7", precision="fp16", strongly_typed=True, builder_flags=[],
            profiles=shapes[0], optimization_profiles=shapes, onnx_sha256="0" * 64, engine_sha256="0" * 64, engine_size_bytes=4))  # fmt: skip
        return path

    config = write_cc_repository(tmp_path / "triton", "enc", {"87": engine("orin.engine", [(8, 64), (8, 128)]),
                                                               "90": engine("h100.engine", [(32, 64), (32, 128), (32, 256)])})
    cfg = text_format.Parse(config.read_text(), model_config_pb2.ModelConfig())
    assert cfg.max_batch_size == 8  # a full batch must run on the Orin engine too
    assert list(cfg.instance_group[0].profile) == ["0", "1"]
    assert dict(cfg.cc_model_filenames) == {"8.7": "model.sm87.plan", "9.0": "model.sm90.plan"}
