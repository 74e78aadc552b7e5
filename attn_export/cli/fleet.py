"""``attn-export fleet FLEET.toml``: models x recipes x targets, locally or on a Ray cluster, with a cache.

Everything in the file is validated before any work: its schema, every point as the main command
would parse it (so an unknown option or target is the main command's own one-line refusal), duplicate
points, and with ``--ray`` the node labels every target asks for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from attn_export.cli.options import JsonOpt, QuietOpt

__all__ = ["main_command_config", "register"]


def main_command_config(args: list[str]) -> Any:
    """The RunConfig ``attn-export ARGS`` would run, parsed by the main command's own parser."""
    from attn_export.cli.app import _register, app
    from attn_export.cli.main_command import config_from_options
    from attn_export.errors import ConfigError

    _register()
    group = typer.main.get_group(app)
    try:
        ctx = group.make_context("attn-export", list(args))
    except Exception as e:  # click's UsageError family (unknown option, bad value; typer vendors click): its own message
        if not hasattr(e, "format_message"):
            raise
        raise ConfigError(f"{e.format_message()} in {' '.join(args)!r}") from None
    extra = [*getattr(ctx, "protected_args", []), *ctx.args]
    if extra or ctx.invoked_subcommand:
        raise ConfigError(f"unexpected arguments {' '.join(extra)!r}: a recipe holds main-command options only")
    return config_from_options(ctx.params)


def _connect(address: str) -> list[dict[str, str]]:
    """Join (``auto``: start a local one) the Ray cluster; the alive nodes' labels."""
    from attn_export.campaigns.fleet.ray_address import check_reachable, parse_ray_address
    from attn_export.errors import ConfigError

    parsed = parse_ray_address(address)
    try:
        import ray
    except ImportError:
        raise ConfigError('--ray needs Ray: pip install -e ".[fleet]" (or run without --ray, locally)') from None

    from attn_export.campaigns.fleet.ray_exec import cluster_labels

    if not ray.is_initialized():
        check_reachable(parsed)  # ray.init would retry an unreachable address for minutes without a word
        ray.init(address=None if parsed is None else parsed[0], include_dashboard=False, logging_level="ERROR",
                 log_to_driver=False)  # fmt: skip
    return cluster_labels()


def _check_cache_outside(cache: Path, out: Path) -> None:
    """The cache and fleet-out are separate folders: fleet-out is replaced on every run, the cache outlives it."""
    from attn_export.errors import ConfigError

    c, o = cache.resolve(), out.resolve()
    if c == o or c.is_relative_to(o) or o.is_relative_to(c):
        raise ConfigError(f"fleet.cache {cache} is inside the output folder {out} (or holds it); "
                          "put the cache beside it (the default: .attn-export-cache next to the fleet file)")


def _updates(points: list[Any], show: Any) -> Any:
    """The table's update, and one line on stderr for each cache entry that failed verification and was rebuilt."""
    by_key = {p.key: p for p in points}

    def update(key: str, status: str, record: dict[str, Any] | None) -> None:
        if record and record.get("cache_rejected") and status != "running":
            print(f"attn-export: warning: cache entry {record.get('cache_key')} for point {by_key[key].key} failed "
                  f"verification ({record['cache_rejected']}); rebuilt it", file=sys.stderr)  # fmt: skip
        show(key, status, record)

    return update


def fleet(
    fleet_file: Annotated[Path, typer.Argument(metavar="FLEET.toml", help="The matrix: models, recipes, targets.")],
    ray_address: Annotated[str | None, typer.Option("--ray", help="Run on Ray: auto (start or join a local one) or an ADDRESS.", show_default="in this process")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Output folder.", show_default="the file's fleet.out")] = None,
    quiet: QuietOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Build and verify a matrix of models x recipes x targets; a content-addressed cache skips unchanged points."""
    from attn_export.campaigns.fleet.matrix import build_points
    from attn_export.campaigns.fleet.result import check_fleet_out
    from attn_export.campaigns.fleet.schema import load_fleet
    from attn_export.host.memory import parse_bytes

    if ray_address is not None:  # a typo is refused before anything is read
        from attn_export.campaigns.fleet.ray_address import parse_ray_address

        parse_ray_address(ray_address)
    spec = load_fleet(fleet_file)
    check_fleet_out(out or spec.fleet.out)  # a file of the user's there: refused now, not after hours of builds
    _check_cache_outside(spec.fleet.cache, out or spec.fleet.out)
    limit = parse_bytes(spec.fleet.cache_limit, "fleet.cache_limit")
    points = build_points(spec, main_command_config)  # every input checked and hashed: the keys are content keys
    node_labels = None
    if ray_address is not None:
        from attn_export.campaigns.fleet.placement import check_cluster_has

        node_labels = _connect(ray_address)
        check_cluster_has(points, node_labels)
    from attn_export.campaigns.fleet.progress import FleetTable
    from attn_export.campaigns.fleet.result import fleet_result, write_fleet

    cache = str(spec.fleet.cache)
    with FleetTable([p.key for p in points], show=not (quiet or as_json)) as table:
        if node_labels is None:
            from attn_export.campaigns.fleet.local import run_local

            records = run_local(points, cache, limit, _updates(points, table.update))
        else:
            from attn_export.campaigns.fleet.ray_exec import run_ray

            records = run_ray(points, cache, limit, spec.fleet.max_retries, _updates(points, table.update))
    result = fleet_result(points, records)
    write_fleet(result, out or spec.fleet.out)
    if as_json:
        print(json.dumps(result, indent=2, default=str))
    elif not quiet:
        print(f"wrote {out or spec.fleet.out}/fleet.md: " + ", ".join(f"{n} {s}" for s, n in result["counts"].items()), file=sys.stderr)
    if any(r["status"] == "failed" for r in result["points"]):
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    app.command("fleet")(fleet)
