"""Typed parameters: one pydantic model per section of ``conf/base/parameters*.yml``.

Field names are the YAML keys, nested mappings are nested models (``thor.lr.peak`` is
``ThorParams.lr.peak``). Every model is strict (a string is not a number, ``1.0`` is not an
integer; an integer passes where a float is expected), forbids unknown keys (a typo is an error)
and is frozen (a node cannot change the configuration another node reads). Choices are
``Literal``s declared once (``choices``), ranges ``Field(ge=..., gt=..., le=..., lt=...)``; rules across
keys are model validators that name the key to change (``CrossKeyProblems``).

One module per parameter file (``common``: ``parameters.yml``; ``baseline``: ``parameters_baseline.yml``;
...), ``base``, ``numbers``, ``schedules`` and ``choices`` for what several share, ``root`` for ``Parameters``
(the whole tree) and ``validate_parameters``, ``errors`` for the wording of the problems. Import from the
package: every name callers use is here.

``pipelines.hooks`` validates the merged configuration against ``Parameters`` before any run starts.
Nodes take single sections (``runtime: RuntimeParams`` from ``params:runtime``), which Kedro builds from
the same models.

This package imports only pydantic and the standard library: validating a configuration must not
load MindSpore (seconds) or MLflow.
"""

from trainlib.params.adasum import AdasumParams
from trainlib.params.base import CheckpointParams, ImageRecipe, LanguageRecipe, Section, TemplateSection
from trainlib.params.baseline import BaselineParams, MomentumTraining
from trainlib.params.choices import (
    BUILTIN_ADASUM_MIN_DEVICES,
    GRAD_CENTRALIZATION_TARGETS,
    AdasumExchange,
    AmpLevel,
    BadFilePolicy,
    ComputeMethod,
    DampingMethod,
    DataSource,
    DeviceTarget,
    ExecutionMode,
    GradCentralization,
    Implementation,
    Initialiser,
    NetworkName,
    Pruner,
    StatisticsDtype,
    TorchvisionArchitecture,
    VerifyMode,
    WarmupShape,
)
from trainlib.params.common import (
    BoostParams,
    DataParams,
    DistributedParams,
    MaxPerClass,
    ModelParams,
    NetworkParams,
    RuntimeParams,
    SplitDirs,
    TargetParams,
    TrackingParams,
)
from trainlib.params.dim_reduce import (
    CollectParams,
    ControlParams,
    DimReduceParams,
    PcaParams,
    Stage1Params,
    Stage2Params,
    TrajectoryParams,
)
from trainlib.params.errors import CrossKeyProblems, ParameterError
from trainlib.params.lars import LarsParams, LarsSettings
from trainlib.params.migrate import MigrateParams, MigrationParity
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, OpenFraction, PositiveFloat, PositiveInt
from trainlib.params.predict import PredictParams
from trainlib.params.report import ReportParams
from trainlib.params.root import Parameters, validate_parameters
from trainlib.params.schedules import (
    SCHEDULE_SHAPES,
    ExponentialSchedule,
    MlperfPolynomialSchedule,
    PolynomialSchedule,
    Schedule,
    ThorEpochSchedule,
    WarmupSchedule,
)
from trainlib.params.study import (
    RecipeSpace,
    ScheduleSpace,
    StudyParams,
    TuningParams,
    space_ranges,
)
from trainlib.params.thor import AdamGraft, MindsporeBuiltinThor, ThorOptions, ThorParams, ThorSettings
from trainlib.params.thor_bert import (
    BertControlTraining,
    BertCorpusParams,
    BertExampleParams,
    BertNetworkParams,
    BertThorTraining,
    BertTokenizerParams,
    ThorBertParams,
)

__all__ = [
    "BUILTIN_ADASUM_MIN_DEVICES",
    "GRAD_CENTRALIZATION_TARGETS",
    "SCHEDULE_SHAPES",
    "AdamGraft",
    "AdasumExchange",
    "AdasumParams",
    "AmpLevel",
    "BadFilePolicy",
    "BaselineParams",
    "BertControlTraining",
    "BertCorpusParams",
    "BertExampleParams",
    "BertNetworkParams",
    "BertThorTraining",
    "BertTokenizerParams",
    "BoostParams",
    "CheckpointParams",
    "CollectParams",
    "ComputeMethod",
    "ControlParams",
    "CrossKeyProblems",
    "DampingMethod",
    "DataParams",
    "DataSource",
    "DeviceTarget",
    "DimReduceParams",
    "DistributedParams",
    "ExecutionMode",
    "ExponentialSchedule",
    "Fraction",
    "GradCentralization",
    "ImageRecipe",
    "Implementation",
    "Initialiser",
    "LanguageRecipe",
    "MaxPerClass",
    "MigrateParams",
    "MigrationParity",
    "MlperfPolynomialSchedule",
    "ModelParams",
    "NetworkParams",
    "LarsParams",
    "LarsSettings",
    "MomentumTraining",
    "NetworkName",
    "NonNegativeFloat",
    "NonNegativeInt",
    "OpenFraction",
    "ParameterError",
    "Parameters",
    "PcaParams",
    "PolynomialSchedule",
    "PositiveFloat",
    "PositiveInt",
    "PredictParams",
    "Pruner",
    "RecipeSpace",
    "ReportParams",
    "RuntimeParams",
    "Schedule",
    "ScheduleSpace",
    "Section",
    "SplitDirs",
    "Stage1Params",
    "Stage2Params",
    "StatisticsDtype",
    "StudyParams",
    "TargetParams",
    "TemplateSection",
    "ThorBertParams",
    "ThorEpochSchedule",
    "MindsporeBuiltinThor",
    "ThorOptions",
    "ThorSettings",
    "ThorParams",
    "TorchvisionArchitecture",
    "TrackingParams",
    "TrajectoryParams",
    "TuningParams",
    "VerifyMode",
    "WarmupSchedule",
    "WarmupShape",
    "space_ranges",
    "validate_parameters",
]
