"""Project pipelines."""

from kedro.pipeline import Pipeline

from .adasum.pipeline import create_pipeline as create_adasum
from .baseline.pipeline import create_pipeline as create_baseline
from .data.pipeline import create_pipeline as create_data
from .dim_reduce.pipeline import create_pipeline as create_dim_reduce
from .migrate.pipeline import create_pipeline as create_migrate
from .report.pipeline import create_pipeline as create_report
from .thor.pipeline import create_pipeline as create_thor


def register_pipelines() -> dict[str, Pipeline]:
    data = create_data()
    baseline = create_baseline()
    return {
        "data": data,
        "baseline": data + baseline,
        "dim_reduce": data + create_dim_reduce(),
        "thor": data + create_thor(),
        "adasum": data + create_adasum(),
        "report": create_report(),
        "migrate": create_migrate(),
        "__default__": data + baseline,
    }
