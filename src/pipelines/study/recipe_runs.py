"""The study's trainings: each recipe's own Kedro pipeline, run per seed (``trainlib.study.runner.RecipeTrainer``).

What ``kedro run --pipelines=<recipe>`` runs, the study runs: the recipe's registered pipeline
(``RecipeSpec.pipeline_name``), its own nodes only (the manifest and class index are the study's), up to each
result row's ``history`` and ``step_history`` (no evaluation, export or comparison node: the engine's last row
already holds the whole val split's accuracy), through Kedro's ``SequentialRunner`` on an in-memory ``DataCatalog``.
Its parameters are the configuration with, per seed: ``runtime.seed``; the study's budget on each result row's
section; the row's own values (``ResultRow.values``) and a tuning's; every ``dir`` under the recipe's section moved
under ``<study.dir>/checkpoints/<key>``; one device, or ``study.adasum_workers`` ranks (``RecipeSpec.several_ranks``).
Kedro's ``ParameterValidator`` gives the nodes their typed sections, as a ``kedro run``'s catalog does.

Each training's nodes (those of its namespace, and the nodes outside any training before it: dim_reduce's PCA runs
with stage 2, which it feeds) run in a child run of the study's (``StudyTracking.run``), named
``<recipe>/<training>/seed<N>``, with the parameters they read; the study's own callbacks (a tuning trial's pruner)
observe them (``trainlib.engine.callbacks.observing_trainings``): Kedro calls the nodes, not the study.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from graphlib import TopologicalSorter

from kedro.framework.project import pipelines
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import Pipeline
from kedro.runner import SequentialRunner
from kedro.validation import ParameterValidator

from pipelines.modular import PARAMS_PREFIX, value_at
from trainlib.engine.callbacks import observing_trainings
from trainlib.engine.resume import fingerprint
from trainlib.metrics import STEPS_PER_EPOCH, table_rows
from trainlib.params.recipe_spec import RecipeSpec, ResultRow, recipe_specs
from trainlib.study.budget import budget_update
from trainlib.study.runner import StudyPlan, StudyTracking, Trained, final_accuracy, training_title

FOLDER_KEY = "dir"  # under a recipe's section: a folder its trainings write (RecipeSpec)
# a fingerprint's stand-in for the study's folder: where the checkpoints go does not change what trains
ANY_FOLDER = "<study.dir>/checkpoints/<key>"


@dataclass(frozen=True)
class _PipelineRun:
    """One run of a recipe's pipeline: the result rows that train with the same ``values``, and the nodes that train
    them."""

    rows: tuple[ResultRow, ...]
    values: Mapping[str, object]
    pipeline: Pipeline


class RecipePipelines:
    """The study's ``RecipeTrainer``: each recipe's registered pipeline on the configuration ``parameters`` (Kedro's
    ``parameters``), the data pipeline's ``manifest`` and ``class_index``, and the study's ``plan``."""

    def __init__(self, parameters: Mapping, manifest, class_index: Mapping[str, int], plan: StudyPlan):
        self._configured = plain(parameters)
        self._data = {"manifest": manifest, "class_index": class_index}
        self._plan = plan
        workers = self._configured["distributed"]["worker_num"]
        if workers != 1:
            raise ValueError(
                f"study runs its trainings in this process, one device: distributed.worker_num is {workers}, set it "
                "to 1 for the study"
            )

    def configured(self, key: str) -> object:
        return value_at(self._configured, key)

    def configuration(self, recipe: str, seed: int, values: Mapping[str, object]) -> str:
        read = [
            {name: value_at(parameters, name) for name in _parameter_names(run.pipeline)}
            for run, parameters in self.trained_with(recipe, seed, values, ANY_FOLDER)
        ]
        return fingerprint(recipe, seed, read)

    def trained_with(
        self, recipe: str, seed: int, values: Mapping[str, object], folder: str
    ) -> list[tuple[_PipelineRun, dict]]:
        """Each run of ``recipe``'s pipeline that trains its result rows on ``seed`` with ``values``, with the
        configuration it reads (its folders under ``folder``)."""
        spec = recipe_specs()[recipe]
        runs = self._pipeline_runs(spec, spec.results, values)
        return [(run, self._parameters(spec, run, seed, values, folder)) for run in runs]

    def train(
        self,
        recipe: str,
        seed: int,
        key: str,
        results: Sequence[str],
        values: Mapping[str, object],
        tracking: StudyTracking,
    ) -> dict[str, Trained]:
        spec = recipe_specs()[recipe]
        chosen = [row for row in spec.results if row.name in results]
        runs = self._pipeline_runs(spec, chosen, values)
        trained: dict[str, Trained] = {}
        for run in runs:
            # rows of other values train apart: each its own folder, as each is its own training
            folder = self._plan.directory / "checkpoints" / key / (run.rows[0].name if len(runs) > 1 else "")
            parameters = self._parameters(spec, run, seed, values, str(folder))
            typed = ParameterValidator({spec.pipeline_name: run.pipeline}).validate_raw_params(parameters)
            trainings = _trainings(spec, run)
            # every dataset in memory, declared here: one training's outputs are the next one's inputs (Kedro checks a
            # run's inputs against the datasets its catalog declares); those kept until the next training reads them
            shared = _shared(trainings)
            catalog = DataCatalog(
                {
                    name: _Kept() if name in shared else MemoryDataset()
                    for name in run.pipeline.datasets() - run.pipeline.inputs()
                }
            )
            for name in run.pipeline.inputs():
                catalog[name] = value_at(typed, name) if name.startswith(PARAMS_PREFIX) else self._data[name]
            for training, nodes in trainings.items():
                part = Pipeline(nodes)
                row = next((row for row in run.rows if row.section == training), None)
                result = row.name if row else training.rpartition(".")[2]
                tags = {"recipe": recipe, "result": result, "seed": str(seed), "study_key": key}
                if spec.several_ranks:
                    tags["workers"] = str(self._plan.adasum_workers)
                read = {name.removeprefix(PARAMS_PREFIX): value_at(typed, name) for name in _parameter_names(part)}
                with tracking.run(training_title(spec, training, row, seed), tags, read) as run_id:
                    with observing_trainings(tracking.callbacks()):
                        SequentialRunner().run(part, catalog)
                    if row is not None:
                        trained[row.name] = _trained(catalog, row, run_id)
                        tracking.log_final(final_accuracy(trained[row.name].history))
        return trained

    def _pipeline_runs(
        self, spec: RecipeSpec, rows: Sequence[ResultRow], values: Mapping[str, object]
    ) -> list[_PipelineRun]:
        registered = pipelines[spec.pipeline_name].only_nodes_with_namespaces([spec.pipeline_name])
        grouped: dict[tuple, list[ResultRow]] = {}
        for row in rows:
            grouped.setdefault(row.values, []).append(row)
        return [
            _PipelineRun(
                tuple(group),
                {**dict(row_values), **values},
                registered.to_outputs(*(f"{row.section}.{name}" for row in group for name in _KEPT)),
            )
            for row_values, group in grouped.items()
        ]

    def _parameters(self, spec: RecipeSpec, run: _PipelineRun, seed: int, values: Mapping, folder: str) -> dict:
        """The configuration as ``run`` trains on ``seed``, its folders under ``folder``."""
        ranks = self._plan.adasum_workers if spec.several_ranks else 1
        updates: dict[str, object] = {
            "runtime.seed": seed,
            "distributed.worker_num": ranks,
            "distributed.local_worker_num": ranks,
        }
        for row in run.rows:
            budget = budget_update(row.section, epochs=self._plan.epochs, eval_every_steps=self._plan.eval_every_steps)
            updates |= {f"{row.section}.{name}": value for name, value in budget.items()}
        updates |= run.values
        parameters = copy.deepcopy(self._configured)
        for key, value in updates.items():
            set_value(parameters, key, value)
        for key in _folder_keys(value_at(parameters, spec.section), spec.section):
            set_value(parameters, key, f"{folder}/{key.removesuffix(f'.{FOLDER_KEY}')}")
        return parameters


_KEPT = ("history", "step_history")  # what the study keeps of each result row's training


def _trainings(spec: RecipeSpec, run: _PipelineRun) -> dict[str, list]:
    """The nodes of ``run`` by the training (namespace) they belong to, in an order the trainings can run: a result
    row's, or another training of the recipe (dim_reduce's stage 1); a node outside any runs with the first training
    it feeds (dim_reduce's PCA with stage 2, thor_bert's corpus and tokenizer with its first training)."""
    namespaces = [row.section for row in run.rows] + [f"{spec.section}.{name}" for name, _ in spec.other_trainings]
    nodes = run.pipeline.nodes  # in an order Kedro runs them
    training_of: dict[str, str] = {}
    for node in nodes:
        namespace = node.namespace or ""
        owner = next((ns for ns in namespaces if namespace == ns or namespace.startswith(f"{ns}.")), None)
        if owner is not None:
            training_of[node.name] = owner
    for node in reversed(nodes):  # each reader of a node comes after it: its training is known by then
        if node.name not in training_of:
            readers = [other.name for other in nodes if set(node.outputs) & set(other.inputs)]
            if not readers:
                raise ValueError(f"{spec.name}: node {node.name} feeds none of its trainings")
            training_of[node.name] = training_of[readers[0]]
    maker = {dataset: node.name for node in nodes for dataset in node.outputs}
    needs: dict[str, set[str]] = {training: set() for training in dict.fromkeys(training_of.values())}
    for node in nodes:
        made_by = {training_of[maker[dataset]] for dataset in node.inputs if dataset in maker}
        needs[training_of[node.name]] |= made_by - {training_of[node.name]}
    return {
        training: [node for node in nodes if training_of[node.name] == training]
        for training in TopologicalSorter(needs).static_order()
    }


class _Kept(MemoryDataset):
    """A dataset one training writes and another reads: each training is a run of its own, and Kedro's runner
    releases a dataset after its last reader in that run."""

    def release(self) -> None:
        pass  # released with the catalog, once the recipe's run is over


def _shared(trainings: dict[str, list]) -> set[str]:
    """The datasets of one training that another one reads (thor_bert's examples, dim_reduce's stage-1 checkpoint)."""
    written = {training: {name for node in nodes for name in node.outputs} for training, nodes in trainings.items()}
    read = {training: {name for node in nodes for name in node.inputs} for training, nodes in trainings.items()}
    return {
        name
        for training in trainings
        for other in trainings
        if other != training
        for name in written[training] & read[other]
    }


def _trained(catalog: DataCatalog, row: ResultRow, run_id: str | None) -> Trained:
    steps = catalog.load(f"{row.section}.step_history")
    steps_per_epoch = int(steps[STEPS_PER_EPOCH].iloc[0]) if len(steps) else 0
    return Trained(
        run_id,
        table_rows(catalog.load(f"{row.section}.history")),
        table_rows(steps.drop(columns=STEPS_PER_EPOCH)),
        steps_per_epoch,
    )


def _parameter_names(pipeline: Pipeline) -> list[str]:
    return sorted(name for name in pipeline.inputs() if name.startswith(PARAMS_PREFIX))


def _folder_keys(section, prefix: str) -> list[str]:
    """The dotted keys named ``dir`` under ``section`` (a mapping at ``prefix``)."""
    if not isinstance(section, Mapping):
        return []
    keys = []
    for name, value in section.items():
        if name == FOLDER_KEY and isinstance(value, str):
            keys.append(f"{prefix}.{name}")
        keys += _folder_keys(value, f"{prefix}.{name}")
    return keys


def plain(value):
    """Kedro's parameters as plain mappings: a section it validated (a pydantic model) as its fields."""
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Mapping):
        return {key: plain(inner) for key, inner in value.items()}
    if isinstance(value, list | tuple):
        return [plain(inner) for inner in value]
    return value


def set_value(tree: dict, key: str, value) -> None:
    """Set the dotted key ``key`` of ``tree``, which must exist."""
    head, _, name = key.rpartition(".")
    parent = value_at(tree, head) if head else tree
    if name not in parent:
        raise KeyError(f"the configuration has no key {key!r}")
    parent[name] = value
