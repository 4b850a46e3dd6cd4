"""The project's configuration files as Kedro's own loader reads them: which environments exist, which one a run's
configuration came from, the parameters before ``--params``, and the file that set each parameter (for the
messages of ``trainlib.params.validate_parameters``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from kedro.config import AbstractConfigLoader
from kedro.framework.project import settings

CONFIG_FILE_SUFFIXES = (".yml", ".yaml", ".json")  # what Kedro's loader reads
PARAMETERS = "parameters"


def project_config_loader(
    conf_source: str | Path, env: str | None = None, runtime_params: dict | None = None
) -> AbstractConfigLoader:
    """A configuration loader built as ``KedroSession`` builds the project's: ``settings.CONFIG_LOADER_CLASS`` with
    ``settings.CONFIG_LOADER_ARGS``. Its resolvers matter: building an OmegaConfigLoader unregisters ``oc.env`` for
    the whole process, then registers the resolvers it is given (mlflow.yml reads ``oc.env``)."""
    return settings.CONFIG_LOADER_CLASS(
        conf_source=str(conf_source), env=env, runtime_params=runtime_params, **settings.CONFIG_LOADER_ARGS
    )


def leaf_items(tree: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of the leaves of a parameters mapping (a list or an empty mapping is a leaf)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaf_items(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory (``conf/base/parameters.yml``) when it lies below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


class ParameterFiles:
    """The parameter files of configuration environment ``env`` over the base environment, read by the project's
    loader without ``--params`` (which that loader would merge into every file it reads)."""

    def __init__(self, conf_source: str | Path, env: str):
        self.conf_source = Path(conf_source)
        self.env = env
        self._loader = project_config_loader(conf_source, env)

    def merged(self) -> dict:
        """The parameters a run of ``env`` reads before ``--params``: base, then ``env``, merged by Kedro."""
        return self._loader[PARAMETERS]

    def of_environment(self, folder: str | None = None) -> dict:
        """The parameters of one environment's files alone (the base environment's by default)."""
        return self._load(self.conf_source / (folder or self._loader.base_env))

    def sources(self, runtime_params: dict | None = None) -> dict[str, str]:
        """The file (or ``--params``) that last set each dotted parameter key, in Kedro's merge order (base,
        ``env``, then ``runtime_params``).

        Kedro's loader merges the files but reports no file per key, so each file is loaded alone, by the loader
        itself: its public ``load_and_merge_dir_config`` lists the files its patterns match in a folder (its
        ``processed_files`` argument), then loads each of them alone. A key is set by one file of a folder only
        (the loader refuses a key set twice in one environment), so the last folder to set it names its file.
        """
        sources: dict[str, str] = {}
        for source, parameters in self.each(runtime_params):
            sources.update(dict.fromkeys((key for key, _ in leaf_items(parameters)), source))
        return sources

    def each(self, runtime_params: dict | None = None) -> Iterator[tuple[str, dict]]:
        """(file, its parameters alone) for every parameter file, in Kedro's merge order (base, then ``env``), then
        ``("--params", runtime_params)``: each file loaded alone by the loader itself (``sources``)."""
        for folder in dict.fromkeys((self._loader.base_env, self.env)):
            files: set[Path] = set()
            self._load(self.conf_source / folder, files)
            for file in sorted(files):
                yield shown_path(file), self._load(file.parent, pattern=file.name)
        yield "--params", runtime_params or {}

    def _load(self, folder: Path, files: set[Path] | None = None, pattern: str | None = None) -> dict:
        """The parameter files of ``folder`` (only ``pattern`` when given), merged; the files read go into
        ``files``. An absent folder (conf/local is optional) holds none."""
        if not folder.is_dir():
            return {}
        patterns = [pattern] if pattern else self._loader.config_patterns[PARAMETERS]
        return self._loader.load_and_merge_dir_config(
            str(folder), patterns, PARAMETERS, set() if files is None else files
        )


def parameter_sources(conf_source: str | Path, env: str, runtime_params: dict | None) -> dict[str, str]:
    """``ParameterFiles(conf_source, env).sources(runtime_params)``: the file (or ``--params``) of each key."""
    return ParameterFiles(conf_source, env).sources(runtime_params)


def configuration_env(conf_source: str | Path, env: str | None) -> str:
    """The environment the configuration came from: ``env`` when given; without it Kedro applies
    conf/local on top of conf/base, so ``local`` when conf/local holds a configuration file, else ``base``."""
    if env:
        return env
    local = Path(conf_source) / "local"
    has_files = local.is_dir() and any(p.suffix in CONFIG_FILE_SUFFIXES for p in local.rglob("*"))
    return "local" if has_files else "base"


def require_environment(conf_source: str | Path, env: str | None) -> None:
    """Refuse an ``--env`` that names no folder of ``conf_source``, listing those that exist (``local`` may be
    absent: it is optional)."""
    if env is None or env == "local" or (Path(conf_source) / env).is_dir():
        return
    existing = sorted(p.name for p in Path(conf_source).iterdir() if p.is_dir() and not p.name.startswith("."))
    raise click.ClickException(
        f"configuration environment {env!r} does not exist: {shown_path(Path(conf_source))}/ holds "
        f"{', '.join(existing)}; choose one of those with --env (base is the CPU default, used without --env)"
    )
