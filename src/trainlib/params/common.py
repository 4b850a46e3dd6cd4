"""The sections of ``conf/*/parameters.yml`` that every pipeline reads: runtime, distributed, data, model, boost,
target and tracking."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from trainlib.params.base import Section
from trainlib.params.choices import (
    BadFilePolicy,
    DataSource,
    DeviceTarget,
    ExecutionMode,
    GradCentralization,
    Initialiser,
    NetworkName,
    VerifyMode,
)
from trainlib.params.errors import CrossKeyProblems
from trainlib.params.numbers import Fraction, NonNegativeFloat, NonNegativeInt, PositiveInt


class RuntimeParams(Section):
    device_target: DeviceTarget
    mode: ExecutionMode
    seed: int
    # true: rehearse the environment's recipe on this CPU machine with a few batches (trainlib.fast_dev_run)
    fast_dev_run: bool


class DistributedParams(Section):
    """msrun's job: ``worker_num`` devices in all, ``local_worker_num`` on each node."""

    worker_num: PositiveInt
    local_worker_num: PositiveInt
    master_addr: str
    master_port: Annotated[int, Field(ge=1024, le=65535)]
    node_rank: NonNegativeInt
    cluster_timeout_s: PositiveInt  # seconds
    # seconds a worker waits between its messages to msrun's scheduler while it joins, exchanges hostnames and
    # leaves: [lower, upper], a random value between (MindSpore's MS_RETRY_INTERVAL_LOWER / _UPPER); null leaves
    # them to MindSpore (its default, or the environment's variables)
    scheduler_retry_interval_s: Annotated[list[PositiveInt], Field(min_length=2, max_length=2)] | None
    log_dir: str

    @property
    def nodes(self) -> int:
        """Number of machines in the job."""
        return self.worker_num // self.local_worker_num

    @model_validator(mode="after")
    def _node_layout(self) -> DistributedParams:
        workers, local, node = self.worker_num, self.local_worker_num, self.node_rank
        interval = self.scheduler_retry_interval_s
        if local > workers:
            problem = ("distributed.local_worker_num", f"is {local}, more than distributed.worker_num ({workers})")
        elif workers % local:
            problem = (
                "distributed.worker_num",
                f"is {workers}, not a multiple of distributed.local_worker_num ({local}): every node runs the "
                "same number of workers",
            )
        elif not 0 <= node < self.nodes:
            problem = (
                "distributed.node_rank",
                f"is {node}; with {workers} workers, {local} per node, use 0..{self.nodes - 1}",
            )
        elif interval and interval[0] > interval[1]:
            problem = ("distributed.scheduler_retry_interval_s", f"is {interval}: give [lower, upper]")
        else:
            return self
        CrossKeyProblems.raise_if_any([problem])
        return self


class SplitDirs(Section):
    """Sub-folders of ``data.root`` holding each split."""

    train: str
    val: str


class MaxPerClass(Section):
    """Images kept per class and split; ``None`` keeps all."""

    train: PositiveInt | None
    val: PositiveInt | None


class DataParams(Section):
    source: DataSource
    root: str
    split_dirs: SplitDirs
    verify: VerifyMode
    on_bad_file: BadFilePolicy
    max_per_class: MaxPerClass
    subset_seed: int
    image_size: PositiveInt  # pixels
    crop_scale: Annotated[list[float], Field(min_length=2, max_length=2)]  # area range of the random crop
    eval_resize_ratio: Annotated[float, Field(gt=0, le=1)]
    eval_batch_size: PositiveInt
    num_workers: PositiveInt
    cache_dir: str  # per-file verdicts (verified.sqlite) and the MindRecord chunks the trainings read
    # the val images of the evaluation every <recipe>.eval_every_steps steps, drawn with subset_seed; None: all
    step_eval_images: PositiveInt | None = None
    # source fashion_mnist: write it out under a data.root that does not exist yet, elsewhere than the default folder
    create_root: bool = False


class NetworkParams(Section):
    """The ResNet an image recipe trains (``network:``): part of a training's identity."""

    name: NetworkName
    num_classes: PositiveInt | None  # None: the number of classes in the data
    conv_init: Initialiser
    dense_init: Initialiser


class ModelParams(Section):
    """The MLflow model a training logs (``model:``): its final network exported to MindIR (``hooks.models``).
    Not part of a training's identity (excluded from ``model_dump``, so checkpoints resume whatever it is)."""

    # YAML ``register``: each training's exported model becomes a version of a registered model (hooks.models);
    # named apart in Python, where ``register`` is pydantic's metaclass method
    register_model: bool = Field(alias="register", exclude=True)
    export_batch_size: PositiveInt = Field(exclude=True)  # the exported MindIR's fixed batch (predict.export)


class BoostParams(Section):
    """mindspore.boost options of the Momentum trainings."""

    less_bn: bool
    grad_centralization: GradCentralization
    grad_freeze: bool
    freeze_param_groups: Annotated[int, Field(ge=2)]  # a single group freezes nothing
    freeze_type: Annotated[int, Field(ge=0, le=1)]  # 0: groups in consecutive runs | 1: interleaved at random
    freeze_p: Fraction
    grad_accumulation_steps: PositiveInt  # 1: no accumulation

    @property
    def enabled(self) -> bool:
        """Whether any option is on (otherwise the step is a plain TrainOneStepCell)."""
        return self.less_bn or self.grad_freeze or self.grad_accumulation_steps > 1

    @model_validator(mode="after")
    def _compatible_options(self) -> BoostParams:
        problems = []
        accumulation = self.grad_accumulation_steps
        if self.grad_freeze and accumulation > 1:
            problems.append(
                (
                    "boost.grad_freeze",
                    f"and boost.grad_accumulation_steps ({accumulation}) cannot be used together: MindSpore's "
                    "gradient-freeze cell breaks when it accumulates (_TrainFreezeCell reads an optimizer attribute "
                    "it never sets); set boost.grad_freeze: false or boost.grad_accumulation_steps: 1",
                )
            )
        if self.less_bn and accumulation > 1:
            problems.append(
                (
                    "boost.less_bn",
                    f"and boost.grad_accumulation_steps ({accumulation}) cannot be used together: MindSpore then "
                    "updates the gamma and beta of the BatchNorms LessBN deleted with a spurious gradient, so the "
                    "checkpoint's network (which keeps those layers) is not the one trained; set boost.less_bn: false "
                    "or boost.grad_accumulation_steps: 1",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


class TargetParams(Section):
    """The one target of time to target, for the report and the study alike."""

    top1: Annotated[float, Field(gt=0, le=1)]  # val top-1, a fraction, not a percentage


class TrackingParams(Section):
    """What MLflow keeps beside metrics and parameters."""

    # MB (10^6 bytes): a catalog dataset marked as an artifact is copied into the MLflow run up to this size; a
    # larger file (the PCA matrix: about 3.3 GB on ImageNet) is logged as its path, size and sha256 instead
    artifact_max_mb: NonNegativeFloat
    # seconds a tracking server may be away (a restart, its database's) before the run stops naming it; null keeps
    # MLflow's own retries (its MLFLOW_HTTP_REQUEST_* variables: about 4 minutes). Past MLflow's largest schedule
    # (10 retries, each wait at most 120 s) no window can be given (pipelines.tracking.outage)
    server_retry_window_s: Annotated[float, Field(ge=0, le=1080)] | None = None
