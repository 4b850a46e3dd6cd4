"""Seconds to log one baseline run's node parameters to a team's MLflow server behind its login, kedro-mlflow's own
hook (one request per parameter) against the project's ``NodeParamsMlflowHook`` (one ``log_batch`` per node).

Starts ``mlflow server --app-name model-training-auth`` (MLflow's login with the project's UI plugin, as
docs/team.md starts it, on a SQLite backend store in a temporary folder) with a user; then, alternating, each
hook's ``before_node_run`` over the baseline pipeline's nodes, with the parameters conf/base gives them (the
configuration's mappings, as ``MlflowRunHooks`` hands them on), into a new run each time. Prints each hook's
median and the ratio.

    .venv/bin/python benchmarks/param_logging.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pipelines  # noqa: F401  (sets the CPU speed environment before MindSpore loads)

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # the tests' own server helpers: the team server as docs/team.md starts it
from tests.support.servers import TeamServer, team_mlflow_server  # noqa: E402


def baseline_node_inputs() -> list[tuple[object, dict]]:
    """The baseline pipeline's nodes, each with its ``params:`` inputs as conf/base's mappings."""
    from kedro.config import OmegaConfigLoader

    from pipelines.pipeline_registry import register_pipelines

    loader = OmegaConfigLoader(
        str(PROJECT / "conf"), base_env="base", default_run_env="local", merge_strategy={"parameters": "soft"}
    )
    params = loader["parameters"]
    nodes = []
    for node in register_pipelines()["baseline"].nodes:
        inputs = {}
        for name in node.inputs:
            if name.startswith("params:"):
                value = params
                for key in name.removeprefix("params:").split("."):
                    value = value[key]
                inputs[name] = value
        nodes.append((node, inputs))
    return nodes


def hook_seconds(hook, nodes: list[tuple[object, dict]], experiment_id: str) -> float:
    """Seconds for ``hook.before_node_run`` over ``nodes`` inside a new run."""
    import mlflow

    with mlflow.start_run(experiment_id=experiment_id):
        started = time.perf_counter()
        for node, inputs in nodes:
            hook.before_node_run(node=node, catalog=None, inputs=dict(inputs), is_async=False)
        return time.perf_counter() - started


def configured(hook):
    """``hook`` set up as conf/base/mlflow.yml sets kedro-mlflow (what its ``before_pipeline_run`` reads)."""
    hook.flatten, hook.recursive, hook.sep, hook.long_params_strategy = True, True, ".", "truncate"
    return hook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per hook, alternated")
    args = parser.parse_args()

    nodes = baseline_node_inputs()
    requests = sum(len(flat_keys(inputs)) for _, inputs in nodes)
    admin = ("admin", secrets.token_urlsafe(12))
    with tempfile.TemporaryDirectory() as folder:
        with team_mlflow_server(f"sqlite:///{folder}/mlflow.db", Path(folder), admin[1]) as url:
            user = TeamServer.with_user(url, admin, "alice", secrets.token_urlsafe(12)).user
            os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = user
            seconds, keys = measure(url, nodes, args.repeats)
    print(f"\nbaseline run: {len(nodes)} nodes, {requests} params (one request each per-param), {keys} distinct")
    per_param, batched = (statistics.median(values) for values in seconds.values())
    print(f"per-param (kedro-mlflow's hook): median {per_param:.1f} s over {args.repeats}")
    print(f"batched (NodeParamsMlflowHook): median {batched:.1f} s over {args.repeats}")
    print(f"ratio: {per_param / batched:.1f}x")


def flat_keys(inputs: dict) -> list[str]:
    """The dotted keys kedro-mlflow flattens ``params:`` inputs to."""

    def visit(prefix: str, value) -> list[str]:
        if isinstance(value, dict) and value:
            return [key for name, inner in value.items() for key in visit(f"{prefix}.{name}", inner)]
        return [prefix]

    return [key for name, value in inputs.items() for key in visit(name.removeprefix("params:"), value)]


def measure(url: str, nodes, repeats: int) -> tuple[dict[str, list[float]], int]:
    """Each hook's seconds per run, alternated ``repeats`` times, and the distinct keys of the last run."""
    import mlflow
    from kedro_mlflow.framework.hooks import MlflowHook

    from pipelines.hooks import NodeParamsMlflowHook

    mlflow.set_tracking_uri(url)
    experiment_id = mlflow.create_experiment("param-logging")
    hooks = {"per-param": configured(MlflowHook()), "batched": configured(NodeParamsMlflowHook())}
    seconds: dict[str, list[float]] = {name: [] for name in hooks}
    for repeat in range(repeats):
        for name, hook in hooks.items():
            seconds[name].append(hook_seconds(hook, nodes, experiment_id))
            print(f"repeat {repeat + 1}: {name} {seconds[name][-1]:.1f} s", flush=True)
    (run,) = mlflow.search_runs([experiment_id], max_results=1, output_format="list")
    return seconds, len(run.data.params)


if __name__ == "__main__":
    main()
