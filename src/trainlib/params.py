"""Typed parameters: one pydantic model per section of ``conf/base/parameters*.yml``.

Field names are the YAML keys, nested mappings are nested models (``thor.lr.peak`` is
``ThorParams.lr.peak``). Every model is strict (a string is not a number, ``1.0`` is not an
integer; an integer passes where a float is expected), forbids unknown keys (a typo is an error)
and is frozen (a node cannot change the configuration another node reads). Choices are
``Literal``s, ranges ``Field(ge=..., gt=..., le=..., lt=...)``; rules across keys are model
validators that name the key to change (``CrossKeyProblems``).

``Parameters`` is the whole tree; ``pipelines.hooks`` validates the merged configuration against
it before any run starts. Nodes take single sections (``runtime: RuntimeParams`` from
``params:runtime``), which Kedro builds from the same models.

This module imports only pydantic and the standard library: validating a configuration must not
load MindSpore (seconds) or MLflow.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator
from pydantic_core import ErrorDetails, PydanticCustomError

# The choices. The library modules that act on them keep tuples of the same names
# (tests/test_conf.py, test_parameter_choices_match_the_library, checks that both agree).
DeviceTarget = Literal["CPU", "GPU", "Ascend"]
ExecutionMode = Literal["graph", "pynative"]
DataSource = Literal["fashion_mnist", "folder"]
VerifyMode = Literal["none", "header", "decode"]
BadFilePolicy = Literal["exclude", "fail"]
NetworkName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet_narrow"]
Initialiser = Literal["he_normal", "xavier_uniform", "truncated_normal"]
GradCentralization = Literal["auto", "on", "off"]
TorchvisionArchitecture = Literal["resnet18", "resnet34", "resnet50", "resnet101"]
RecipeName = Literal["baseline", "dim_reduce", "thor", "adasum"]
AmpLevel = Literal["O0", "O1", "O2", "O3"]
DampingMethod = Literal["mindspore", "factored"]  # trainlib.optim.thor.linalg.DAMPING_METHODS
ComputeMethod = Literal["inverse", "eigen"]  # trainlib.optim.thor.linalg.COMPUTE_METHODS

# MindSpore registers the Centralization kernel in its Ascend plugin only (trainlib.boost.options).
GRAD_CENTRALIZATION_TARGETS = ("Ascend",)
# mindspore.boost's Adasum runs on Ascend with 16 devices or more (Send/Receive between 8-device servers).
BOOST_ADASUM_MIN_DEVICES = 16

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, lt=1)]  # [0, 1): momentum, label smoothing, shares of steps
OpenFraction = Annotated[float, Field(gt=0, lt=1)]  # (0, 1)


class CrossKeyProblems:
    """Builds the error of a model validator: (dotted key, problem) pairs, every one reported.

    The pairs travel in the error's context under ``problems``; ``validate_parameters`` prints each
    with the file its key came from.
    """

    @staticmethod
    def raise_if_any(problems: list[tuple[str, str]]) -> None:
        if problems:
            text = "; ".join(f"{key} {problem}" for key, problem in problems)
            raise PydanticCustomError("cross_key", "{text}", {"text": text, "problems": problems})


class Section(BaseModel):
    """Base of every parameter model: strict types, no unknown keys, read-only."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class TemplateSection(Section):
    """Base of the sections one training template trains (``ImageRecipe``, ``LanguageRecipe``): a node of the
    template types its section with the base, and Kedro's ``model_validate`` of the base gives the section's own
    model, told apart by its keys (each model forbids the others'); the subclasses validate as usual."""

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Section:
        if cls.__base__ is not TemplateSection:  # a section's own model
            return super().model_validate(obj, **options)
        return TypeAdapter(Union[tuple(cls.__subclasses__())]).validate_python(obj, **options)  # noqa: UP007


class ImageRecipe(TemplateSection):
    """A section of the image training template (``pipelines.training``): ``baseline``, ``adasum`` or
    ``thor``. Every node that reads one of these sections types it so (the template's and the study's)."""


class LanguageRecipe(TemplateSection):
    """A section of the thor_bert pipeline's training template: ``thor_bert.thor`` or ``thor_bert.baseline``."""


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
    log_dir: str

    @property
    def nodes(self) -> int:
        """Number of machines in the job."""
        return self.worker_num // self.local_worker_num

    @model_validator(mode="after")
    def _node_layout(self) -> DistributedParams:
        workers, local, node = self.worker_num, self.local_worker_num, self.node_rank
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


class ModelParams(Section):
    name: NetworkName
    num_classes: PositiveInt | None  # None: the number of classes in the data
    conv_init: Initialiser
    dense_init: Initialiser
    # YAML ``register``: each training's exported model becomes a version of a registered model (hooks.models).
    # Not part of a training's identity (excluded from model_dump, so checkpoints resume whatever it is); named
    # apart in Python, where ``register`` is pydantic's metaclass method
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


class WarmupSchedule(Section):
    """The Momentum recipes' schedules (models repo official/cv/ResNet), per step ``i`` of ``T`` with ``W``
    warm-up steps: ``start + (peak - start) i / W`` during the warm-up, then by ``shape``: linear
    ``peak - (peak - end)(i - W)/(T - W)``; cosine ``peak [(T - i)/(T - W) 0.5 (1 + cos(2 pi 0.47 i/(T - W)))
    + 1e-5]``; quadratic (the models repo's ``poly``) ``peak (1 - (i - W)/(T - W))^2``; steps ``peak gamma^k``
    after the k-th of ``milestones`` (epochs); constant ``peak``. ``peak`` is the value for ``reference_devices``
    devices and scales linearly with the devices trained on."""

    shape: Literal["linear", "cosine", "quadratic", "steps", "constant"]
    start: NonNegativeFloat
    peak: PositiveFloat
    end: NonNegativeFloat  # linear only
    warmup_epochs: NonNegativeFloat
    reference_devices: PositiveInt
    milestones: list[int]  # epochs; steps only
    gamma: float  # steps only


class ThorEpochSchedule(Section):
    """THOR's ResNet learning rate (models repo ``get_thor_lr``): ``peak (1 - e/end_epoch)^power``, halved once
    ``e >= halve_epoch`` and again once ``e >= halve_epoch + 1``, ``e`` the epochs done after the step."""

    shape: Literal["thor"]
    peak: PositiveFloat
    power: float
    end_epoch: PositiveInt
    halve_epoch: int


class ExponentialSchedule(Section):
    """``peak rate^(e/decay_epochs)``, ``e`` the epochs done after the step (THOR's ResNet damping, models repo
    ``get_thor_damping``: ``decay_epochs`` 10)."""

    shape: Literal["exponential"]
    peak: PositiveFloat
    rate: PositiveFloat
    decay_epochs: PositiveFloat


class PolynomialSchedule(Section):
    """The models repo's BERT schedules (``BertLearningRate``, ``get_bert_thor_lr``, ``get_bert_thor_damping``):
    ``peak i / warmup_steps`` during the warm-up, then ``(peak - end)(1 - min(i, total_steps)/total_steps)^power +
    end`` with ``i`` counted from step 0; ``total_steps`` null: the training's steps (all of them, the warm-up's
    included, so the lr reaches ``end`` only after the last step, as the models repo passes the total steps)."""

    shape: Literal["polynomial"]
    peak: PositiveFloat
    end: NonNegativeFloat
    power: PositiveFloat
    warmup_steps: NonNegativeInt
    total_steps: PositiveInt | None


# Every schedule of the project, the learning rates and THOR's damping alike: ``shape`` chooses the formula
# (``trainlib.optim.schedules.per_step`` computes it), the same keys mean the same thing in every shape (``peak``
# the value the decay starts from, ``end`` the last, ``power`` the exponent).
Schedule = Annotated[
    WarmupSchedule | ThorEpochSchedule | ExponentialSchedule | PolynomialSchedule, Field(discriminator="shape")
]
SCHEDULE_SHAPES = ("linear", "cosine", "quadratic", "steps", "constant", "thor", "exponential", "polynomial")


class CheckpointParams(Section):
    """Full training state written every ``every_epochs`` epochs, the newest ``keep_last`` kept (removed once
    the training's final checkpoint is saved); of the ``stale-*`` folders, where another configuration's
    checkpoints are moved, the newest ``keep_stale`` kept."""

    dir: str
    every_epochs: PositiveInt
    keep_last: PositiveInt
    keep_stale: PositiveInt = 3  # the newest set moved aside is always kept


class MomentumTraining(Section):
    """The Momentum recipe's keys, shared by baseline, adasum and dim_reduce stage 1."""

    batch_size: PositiveInt  # per device
    lr: Schedule
    momentum: Fraction
    weight_decay: NonNegativeFloat
    label_smoothing: Fraction
    loss_scale: PositiveFloat
    zero_init_last_bn_gamma: bool  # the initial weights' last BatchNorm gamma of each residual block is 0
    eval_interval: NonNegativeInt  # 0: only after the last epoch
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt  # also evaluate on data.step_eval_images every N steps; 0: off


class BaselineParams(MomentumTraining, ImageRecipe):
    epochs: PositiveInt


class AdasumParams(MomentumTraining, ImageRecipe):
    implementation: Literal["own", "mindspore"]
    exchange: Literal["auto", "allgather", "allreduce"]
    average_batchnorm_statistics: bool
    epochs: PositiveInt


class TrajectoryParams(Section):
    """Stage-1 weights kept for the PCA: from ``start_epoch`` every N steps or every N epochs."""

    dir: str
    start_epoch: PositiveInt  # 1-based
    every_steps: PositiveInt | None
    every_epochs: PositiveInt | None


class Stage1Params(MomentumTraining):
    epochs: PositiveInt
    schedule_epochs: PositiveInt
    trajectory: TrajectoryParams


class CollectParams(Section):
    n_files: PositiveInt | None  # the last N trajectory files; None: all


class PcaParams(Section):
    n_components: PositiveInt


class Stage2Params(Section):
    """P-BFGS in the PCA subspace."""

    implementation: Literal["own", "mindspore"]
    epochs: PositiveInt
    batch_size: PositiveInt
    rho: OpenFraction
    max_trials: PositiveInt
    sigma: OpenFraction
    gamma: Fraction
    alpha: NonNegativeFloat
    loss_scale: PositiveFloat
    label_smoothing: Fraction
    checkpoint: CheckpointParams
    # also evaluate on data.step_eval_images every N steps, stage 2 and the control alike (own only); 0: off
    eval_every_steps: NonNegativeInt


class ControlParams(Section):
    checkpoint: CheckpointParams


class DimReduceParams(Section):
    stage1: Stage1Params
    collect: CollectParams
    pca: PcaParams
    stage2: Stage2Params
    control: ControlParams

    @model_validator(mode="after")
    def _consistent_stages(self) -> DimReduceParams:
        problems = []
        stage1, n_files, k = self.stage1, self.collect.n_files, self.pca.n_components
        if n_files is not None and k >= n_files:
            problems.append(
                ("dim_reduce.pca.n_components", f"is {k} but must be below dim_reduce.collect.n_files ({n_files})")
            )
        if stage1.epochs > stage1.schedule_epochs:
            problems.append(
                ("dim_reduce.stage1.epochs", f"is {stage1.epochs}, beyond schedule_epochs {stage1.schedule_epochs}")
            )
        if stage1.trajectory.start_epoch > stage1.epochs:
            problems.append(
                ("dim_reduce.stage1.trajectory.start_epoch", f"is after the last stage-1 epoch ({stage1.epochs})")
            )
        steps, epochs = stage1.trajectory.every_steps, stage1.trajectory.every_epochs
        if steps is not None and epochs is not None:
            problems.append(
                (
                    "dim_reduce.stage1.trajectory.every_epochs",
                    f"is {epochs} while every_steps is {steps}: set exactly one, the other null",
                )
            )
        if steps is None and epochs is None:
            problems.append(("dim_reduce.stage1.trajectory.every_steps", "and every_epochs are both null: set one"))
        if self.stage2.eval_every_steps and self.stage2.implementation != "own":
            problems.append(
                (
                    "dim_reduce.stage2.eval_every_steps",
                    "needs dim_reduce.stage2.implementation own (boost's DimReduce trains whole epochs in Model.train)",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


class MigrationParity(Section):
    """One seeded batch of standard-normal images; tolerances are absolute (relative for updates)."""

    image_size: PositiveInt
    batch_size: Annotated[int, Field(ge=2)]  # training-mode BatchNorm needs two values per channel
    seed: int
    lr: PositiveFloat
    forward_tolerance: PositiveFloat
    step_weight_tolerance: PositiveFloat
    step_update_tolerance: PositiveFloat
    step_noise_factor: PositiveFloat


class MigrateParams(Section):
    state_dict: str
    architecture: TorchvisionArchitecture
    num_classes: PositiveInt
    parity: MigrationParity


class ReportRunIds(Section):
    """An MLflow run id pins a recipe's run; ``None`` takes its latest complete FINISHED run."""

    baseline: str | None
    dim_reduce: str | None
    thor: str | None
    adasum: str | None


class ReportParams(Section):
    recipes: Annotated[list[RecipeName], Field(min_length=1)]
    run_ids: ReportRunIds


class TargetParams(Section):
    """The one target of time to target, for the report and the study alike."""

    top1: Annotated[float, Field(gt=0, le=1)]  # val top-1, a fraction, not a percentage


class PredictParams(Section):
    model: Annotated[str, Field(min_length=1)]  # models:/<name>@<alias> | models:/<name>/<version> | runs:/… | a run id
    images: Annotated[str, Field(min_length=1)]  # a folder of images, or a manifest CSV (its `split` rows)
    split: str
    top_k: PositiveInt


class ThorMindSpore(Section):
    """Options of implementation: mindspore (nn.thor + ModelThor)."""

    amp_level: AmpLevel
    keep_batchnorm_fp32: bool
    dataset_sink_mode: bool


class AdamGraft(Section):
    """Adam grafting (Shampoo's layer-wise grafting): each preconditioned layer's THOR direction is rescaled to the
    norm of the Adam update ``m_hat / (sqrt(v_hat) + eps)`` of the same gradients (moments kept per layer)."""

    beta1: Fraction
    beta2: Fraction
    eps: PositiveFloat


class ThorOptions(Section):
    """The options of this project's THOR (``implementation: own``), one name each for the ResNet (``thor``) and
    BERT (``thor_bert.thor``) sections; every default is today's THOR (``trainlib.optim.thor`` has the maths)."""

    # mindspore: sqrt(damping / P) added to A and to G (nn.thor) | factored: Martens & Grosse's pi-scaled split
    damping_method: DampingMethod = "mindspore"
    # inverse: damped factor inverses (Cholesky) | eigen: eigendecomposed factors, damping on the eigenvalue products
    compute_method: ComputeMethod = "inverse"
    kl_clip: PositiveFloat | None = None  # kfac-pytorch's bound on lr^2 * sum(g . direction); None: off
    adam_graft: AdamGraft | None = None  # None: off

    def option_problems(self, section: str) -> list[tuple[str, str]]:
        """Combinations the options cannot run (``section``: the dotted name of this section, for the message)."""
        problems = []
        block_size = getattr(self, "block_size", None)
        if self.compute_method == "eigen" and block_size is not None:
            problems.append(
                (f"{section}.compute_method", f"eigen decomposes the full factors; set {section}.block_size: null")
            )
        if self.compute_method == "eigen" and getattr(self, "trace_rule", None) is not None:
            problems.append((f"{section}.compute_method", f"eigen has no trace rule; set {section}.trace_rule: null"))
        return problems


class ThorParams(ImageRecipe, ThorOptions):
    implementation: Literal["own", "mindspore"]
    # false: THOR's recipe (schedules, weight decay, initialisation, loss scale) with the gradients passed to the
    # optimizer unchanged: what the curvature adds, measured against THOR's own recipe (implementation own only)
    precondition: bool
    epochs: PositiveInt
    batch_size: PositiveInt
    lr: Schedule
    damping: Schedule
    momentum: Fraction
    weight_decay: NonNegativeFloat
    label_smoothing: Fraction
    loss_scale: PositiveFloat
    frequency: Annotated[int, Field(ge=2)]  # 1 would recompute the inverses every step
    block_size: PositiveInt | None  # None: full inverses
    trace_rule: Annotated[list[float], Field(min_length=2, max_length=2)] | None  # [skip, stop]
    zero_init_last_bn_gamma: bool  # the initial weights' last BatchNorm gamma of each residual block is 0
    split_indices: list[int]  # nn.thor's allreduce fusion groups of the A/G statistics (implementation mindspore)
    eval_interval: NonNegativeInt
    eval_every_steps: NonNegativeInt  # also evaluate on data.step_eval_images every N steps; 0: off
    checkpoint: CheckpointParams
    mindspore: ThorMindSpore

    @model_validator(mode="after")
    def _consistent(self) -> ThorParams:
        problems = []
        if self.trace_rule is not None and not 0 <= self.trace_rule[1] <= self.trace_rule[0]:
            problems.append(("thor.trace_rule", f"is {self.trace_rule}; give [skip, stop] with 0 <= stop <= skip"))
        problems += self.option_problems("thor")
        changed = [key for key, value in ThorOptions().model_dump().items() if getattr(self, key) != value]
        if changed and self.implementation != "own":
            problems.append(
                (
                    f"thor.{changed[0]}",
                    "is an option of this project's THOR; nn.thor (implementation mindspore) has none",
                )
            )
        if not self.precondition and self.implementation != "own":
            problems.append(
                (
                    "thor.precondition",
                    "is false, which switches off this project's preconditioner; MindSpore's nn.thor "
                    "(thor.implementation: mindspore) has no such switch: use implementation own",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


class BertCorpusParams(Section):
    """The text corpus: reST sources under ``root`` (default: the Python 3.11 documentation of Debian's
    ``python3.11-doc``), split by document into train and held-out before anything is fitted."""

    root: str
    held_out_fraction: OpenFraction
    split_seed: int
    max_documents: PositiveInt | None  # the first N documents by name (fast dev runs, tests); None: all


class BertTokenizerParams(Section):
    """A WordPiece vocabulary trained on the train documents (Hugging Face tokenizers)."""

    vocab_size: Annotated[int, Field(ge=16)]  # the 5 special tokens and some pieces
    min_frequency: PositiveInt
    lowercase: bool


class BertExampleParams(Section):
    """Pre-training examples as BERT's create_pretraining_data makes them (masked LM and next sentence)."""

    max_seq_length: Annotated[int, Field(ge=8)]
    max_predictions_per_seq: PositiveInt
    masked_lm_prob: OpenFraction
    short_seq_prob: Fraction
    dupe_factor: PositiveInt
    seed: int


class BertNetworkParams(Section):
    """The BERT encoder and its pre-training heads (the vocabulary size comes from the tokenizer)."""

    hidden_size: PositiveInt
    num_hidden_layers: PositiveInt
    num_attention_heads: PositiveInt
    intermediate_size: PositiveInt
    hidden_dropout_prob: Fraction
    attention_probs_dropout_prob: Fraction
    max_position_embeddings: PositiveInt
    type_vocab_size: PositiveInt
    initializer_range: PositiveFloat

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> BertNetworkParams:
        if self.hidden_size % self.num_attention_heads:
            CrossKeyProblems.raise_if_any(
                [
                    (
                        "thor_bert.network.num_attention_heads",
                        f"is {self.num_attention_heads}, which does not divide hidden_size {self.hidden_size}",
                    )
                ]
            )
        return self


class BertThorTraining(LanguageRecipe, ThorOptions):
    """THOR on BERT: every Dense layer preconditioned, then Momentum; weight decay except on LayerNorm and biases."""

    epochs: PositiveInt
    batch_size: PositiveInt  # per device
    lr: Schedule
    damping: Schedule
    momentum: Fraction
    weight_decay: NonNegativeFloat
    loss_scale: PositiveFloat
    frequency: Annotated[int, Field(ge=2)]
    block_size: PositiveInt | None
    split_indices: list[int]  # nn.thor's allreduce fusion groups of the A/G statistics (recorded)
    eval_interval: NonNegativeInt
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt

    @model_validator(mode="after")
    def _consistent(self) -> BertThorTraining:
        CrossKeyProblems.raise_if_any(self.option_problems("thor_bert.thor"))
        return self


class BertBaselineTraining(LanguageRecipe):
    """The first-order baseline of the THOR document's BERT script (Lamb or AdamWeightDecay, warm-up polynomial lr),
    weight decay except on LayerNorm and biases."""

    optimizer: Literal["adamweightdecay", "lamb"]
    epochs: PositiveInt
    batch_size: PositiveInt  # per device
    lr: Schedule
    weight_decay: NonNegativeFloat
    eps: PositiveFloat
    loss_scale: PositiveFloat
    eval_interval: NonNegativeInt
    checkpoint: CheckpointParams
    eval_every_steps: NonNegativeInt


class ThorBertParams(Section):
    """``thor_bert``: text corpus -> tokenizer -> pre-training examples -> BERT -> THOR and its first-order baseline
    -> masked-LM evaluation on held-out text."""

    corpus: BertCorpusParams
    tokenizer: BertTokenizerParams
    examples: BertExampleParams
    network: BertNetworkParams
    eval_batch_size: PositiveInt
    step_eval_examples: PositiveInt | None  # held-out examples of the evaluation every K steps; None: all
    target_mlm_accuracy: OpenFraction  # time and steps to this held-out masked-LM accuracy (report, study)
    thor: BertThorTraining
    baseline: BertBaselineTraining

    @model_validator(mode="after")
    def _consistent(self) -> ThorBertParams:
        problems = []
        examples, network = self.examples, self.network
        if examples.max_seq_length > network.max_position_embeddings:
            problems.append(
                (
                    "thor_bert.examples.max_seq_length",
                    f"is {examples.max_seq_length}, beyond network.max_position_embeddings "
                    f"{network.max_position_embeddings}",
                )
            )
        if examples.max_predictions_per_seq >= examples.max_seq_length:
            problems.append(
                (
                    "thor_bert.examples.max_predictions_per_seq",
                    f"is {examples.max_predictions_per_seq}, not below max_seq_length {examples.max_seq_length}",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self


class TrackingParams(Section):
    """What MLflow keeps beside metrics and parameters."""

    # MB (10^6 bytes): a catalog dataset marked as an artifact is copied into the MLflow run up to this size; a
    # larger file (the PCA matrix: about 3.3 GB on ImageNet) is logged as its path, size and sha256 instead
    artifact_max_mb: NonNegativeFloat


# dim_reduce gives two result rows, stage2 and control (P-BFGS against Momentum from the same stage 1); adasum
# two, adasum and allreduce (the adasum section's training on study.adasum_workers msrun ranks, both ways)
# thor_first_order: the thor section with thor.precondition false (THOR's recipe without its curvature)
# thor_bert gives two rows, thor_bert and thor_bert_baseline (THOR against the first-order baseline on BERT)
StudyRecipe = Literal["baseline", "thor", "thor_first_order", "dim_reduce", "adasum", "thor_bert"]


# The trainings a study can tune (study.tuning), each named by its result row and with one section of its own:
# thor_first_order the thor section; thor_bert (THOR) thor_bert.thor, thor_bert_baseline thor_bert.baseline
TunedRecipe = Literal["baseline", "thor", "thor_first_order", "thor_bert", "thor_bert_baseline"]
# The study recipes a tuning covers, and the trainings each gives (thor_bert: its two, each with its own trials)
TUNED_TRAININGS: dict[str, tuple[TunedRecipe, ...]] = {
    "baseline": ("baseline",),
    "thor": ("thor",),
    "thor_first_order": ("thor_first_order",),
    "thor_bert": ("thor_bert", "thor_bert_baseline"),
}
PRECONDITIONED: tuple[TunedRecipe, ...] = ("thor", "thor_bert")  # the trainings with THOR's damping and frequency
# [low, high] of a knob a tuning samples: log-uniform (learning rates, damping, weight decay), uniform (warm-up
# epochs), integers (warm-up steps, THOR's frequency)
LogRange = Annotated[list[PositiveFloat], Field(min_length=2, max_length=2)]
LinearRange = Annotated[list[NonNegativeFloat], Field(min_length=2, max_length=2)]
StepRange = Annotated[list[NonNegativeInt], Field(min_length=2, max_length=2)]
FrequencyRange = Annotated[list[Annotated[int, Field(ge=2)]], Field(min_length=2, max_length=2)]


class ScheduleSpace(Section):
    """The keys of a schedule (``<recipe>.lr``, ``thor.damping``) a tuning samples; null: the section's value."""

    peak: LogRange | None = None
    warmup_epochs: LinearRange | None = None  # the Momentum schedules' warm-up (shapes with warmup_epochs)
    warmup_steps: StepRange | None = None  # the BERT schedules' warm-up (shape polynomial)


class RecipeSpace(Section):
    """A training's search space: ranges over the keys of its own section (null: the section's value)."""

    lr: ScheduleSpace | None = None
    weight_decay: LogRange | None = None
    damping: ScheduleSpace | None = None  # THOR's (thor, thor_bert: thor_first_order has no preconditioner)
    frequency: FrequencyRange | None = None  # THOR's statistics and inverses every N steps (thor, thor_bert)


class TuningParams(Section):
    """Tuning at equal effort (``study.tuning``, off with ``trials: 0``): per recipe ``trials`` Optuna trials on the
    tuning ``seeds``, drawn from ``spaces``, in one Optuna study per recipe in ``storage``; the best of each is
    then trained on ``study.seeds``."""

    trials: NonNegativeInt  # per recipe, across every process sharing the storage; 0: no tuning
    seeds: Annotated[list[int], Field(min_length=1)]  # runtime.seed of the trials: disjoint from study.seeds
    sampler: Literal["tpe", "qmc"]
    sampler_seed: int
    pruner: Literal["none", "median"]  # median: stop a trial whose step evaluations fall below the trials' median
    storage: Annotated[str, Field(min_length=1)]  # an Optuna storage URL: sqlite:///<file>, postgresql://..., ...
    name: Annotated[str, Field(min_length=1)]  # Optuna study <name>/<recipe>
    spaces: dict[TunedRecipe, RecipeSpace]

    @model_validator(mode="after")
    def _ranges(self) -> TuningParams:
        problems = []
        for recipe, space in self.spaces.items():
            for key, (low, high) in space_ranges(space).items():
                if not low < high:
                    problems.append(
                        (f"study.tuning.spaces.{recipe}.{key}", f"is {[low, high]}; give [low, high] with low < high")
                    )
            thor_only = [key for key in ("damping", "frequency") if getattr(space, key) is not None]
            if recipe not in PRECONDITIONED and thor_only:
                problems.append(
                    (
                        f"study.tuning.spaces.{recipe}.{thor_only[0]}",
                        f"is set, but {recipe} has no preconditioner: THOR's damping and frequency change nothing",
                    )
                )
        CrossKeyProblems.raise_if_any(problems)
        return self


def space_ranges(space: RecipeSpace) -> dict[str, list[float]]:
    """A search space as its dotted keys in the recipe's section (``lr.peak``, ``weight_decay``) and ranges."""
    ranges = {}
    for key, value in space.model_dump(exclude_none=True).items():
        if isinstance(value, dict):
            ranges |= {f"{key}.{inner}": bounds for inner, bounds in value.items()}
        else:
            ranges[key] = value
    return ranges


class StudyParams(Section):
    """A multi-seed comparison of recipes (``kedro run --pipelines=study``): every recipe and seed on the same data,
    epoch budget and evaluation; each (recipe, seed) run's result is kept in ``dir`` and never rerun."""

    # paired differences: thor against baseline, dim_reduce's stage2 against its control
    recipes: Annotated[list[StudyRecipe], Field(min_length=1)]
    seeds: Annotated[list[int], Field(min_length=1)]  # runtime.seed of each run
    epochs: PositiveInt  # baseline's and thor's budget (replaces <recipe>.epochs); dim_reduce keeps its stages'
    # epoch counts
    eval_every_steps: PositiveInt  # evaluation on data.step_eval_images every N steps (time to target.top1)
    dir: str  # one result file per finished run, and the runs' checkpoints
    adasum_workers: Annotated[int, Field(ge=2)] = 2  # msrun ranks of adasum's trainings: a power of two
    tuning: TuningParams

    @model_validator(mode="after")
    def _distinct(self) -> StudyParams:
        problems = []
        for key, values in (("study.recipes", self.recipes), ("study.seeds", self.seeds)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                problems.append((key, f"repeats {repeated}: each run is one (recipe, seed) pair"))
        workers = self.adasum_workers
        if "adasum" in self.recipes and workers & (workers - 1):
            problems.append(("study.adasum_workers", f"is {workers}; Adasum combines ranks in pairs: use 2, 4, 8, ..."))
        shared = sorted(set(self.seeds) & set(self.tuning.seeds))
        if shared:
            problems.append(
                (
                    "study.tuning.seeds",
                    f"and study.seeds share {shared}: the best configuration is scored on fresh seeds, never on the "
                    "seeds it was chosen on",
                )
            )
        if self.tuning.trials:
            for recipe in self.recipes:
                if recipe not in TUNED_TRAININGS:
                    problems.append(
                        (
                            "study.recipes",
                            f"has {recipe}, which study.tuning does not tune (it tunes "
                            f"{', '.join(TUNED_TRAININGS)}); set study.tuning.trials: 0 or take it out",
                        )
                    )
                    continue
                for training in TUNED_TRAININGS[recipe]:
                    space = self.tuning.spaces.get(training)
                    if space is None or not space_ranges(space):
                        problems.append(
                            (
                                f"study.tuning.spaces.{training}",
                                "is missing or empty: give the ranges its trials draw from",
                            )
                        )
        CrossKeyProblems.raise_if_any(problems)
        return self


class Parameters(Section):
    """The whole merged configuration, with the rules that span sections."""

    runtime: RuntimeParams
    distributed: DistributedParams
    data: DataParams
    model: ModelParams
    boost: BoostParams
    adasum: AdasumParams
    baseline: BaselineParams
    dim_reduce: DimReduceParams
    migrate: MigrateParams
    predict: PredictParams
    report: ReportParams
    thor: ThorParams
    thor_bert: ThorBertParams
    study: StudyParams
    target: TargetParams
    tracking: TrackingParams

    @model_validator(mode="after")
    def _runnable_on_this_target(self) -> Parameters:
        problems = []
        device_target, workers = self.runtime.device_target, self.distributed.worker_num
        if self.adasum.implementation == "mindspore" and (
            device_target != "Ascend" or workers < BOOST_ADASUM_MIN_DEVICES
        ):
            problems.append(
                (
                    "adasum.implementation",
                    "is mindspore (mindspore.boost's Adasum), which MindSpore runs on Ascend with "
                    f"{BOOST_ADASUM_MIN_DEVICES} devices or more (Send/Receive between 8-device servers); this run has "
                    f"{workers} {device_target} worker(s): use own",
                )
            )
        if self.boost.less_bn and self.runtime.mode != "graph":
            problems.append(
                (
                    "boost.less_bn",
                    f"needs runtime.mode graph (it is {self.runtime.mode}): LessBN is a graph-compiler pass and "
                    "changes nothing in pynative mode",
                )
            )
        if (
            self.boost.less_bn
            and self.boost.grad_centralization == "on"
            and device_target not in GRAD_CENTRALIZATION_TARGETS
        ):
            problems.append(
                (
                    "boost.grad_centralization",
                    f"is on, but MindSpore has no Centralization kernel on {device_target} (only on "
                    f"{', '.join(GRAD_CENTRALIZATION_TARGETS)}); use auto (off there) or off",
                )
            )
        if self.thor.implementation == "mindspore" and device_target == "CPU":
            problems.append(
                (
                    "thor.implementation",
                    "is mindspore, whose kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient) exist only on Ascend "
                    "and GPU, but runtime.device_target is CPU; use thor.implementation: own (this project's THOR, "
                    "every backend), or run on Ascend/GPU (--env=ascend, --env=gpu)",
                )
            )
        if self.thor_bert.baseline.optimizer == "lamb" and device_target == "CPU":
            problems.append(
                (
                    "thor_bert.baseline.optimizer",
                    "is lamb, whose kernel MindSpore has only on Ascend and GPU, but runtime.device_target is CPU; use "
                    "adamweightdecay (the script's other first-order choice) on CPU",
                )
            )
        if "dim_reduce" in self.study.recipes and self.dim_reduce.stage2.implementation != "own":
            problems.append(
                (
                    "dim_reduce.stage2.implementation",
                    "is mindspore, but study.recipes has dim_reduce, whose stage 2 the study evaluates every "
                    "study.eval_every_steps steps: use own (or take dim_reduce out of study.recipes)",
                )
            )
        if self.distributed.nodes > 1:
            sections = {
                "baseline": self.baseline,
                "adasum": self.adasum,
                "thor": self.thor,
                "dim_reduce.stage1": self.dim_reduce.stage1,
                "dim_reduce.stage2": self.dim_reduce.stage2,
                "dim_reduce.control": self.dim_reduce.control,
                "thor_bert.thor": self.thor_bert.thor,
                "thor_bert.baseline": self.thor_bert.baseline,
            }
            problems += [
                (
                    f"{name}.checkpoint.keep_last",
                    f"is 1, but the job spans {self.distributed.nodes} nodes, each writing its own checkpoints: a "
                    "node killed between two epochs' checkpoints is one epoch behind, and the rerun resumes from an "
                    "epoch every node holds; use 2 or more",
                )
                for name, section in sections.items()
                if section.checkpoint.keep_last < 2
            ]
        if self.dim_reduce.stage2.implementation == "mindspore" and workers > 1:
            problems.append(
                (
                    "dim_reduce.stage2.implementation",
                    "is mindspore (mindspore.boost's DimReduce), which runs in one process of its own, outside "
                    f"msrun; with distributed.worker_num {workers} use own (P-BFGS averages gradients and losses "
                    "across the ranks)",
                )
            )
        CrossKeyProblems.raise_if_any(problems)
        return self

    @model_validator(mode="after")
    def _tuning_spaces_fit_their_sections(self) -> Parameters:
        """A tuned warm-up needs a learning-rate schedule with one in that unit (THOR's ResNet schedule has none;
        the Momentum schedules count epochs, the BERT ones steps)."""
        sections = {
            "baseline": self.baseline,
            "thor": self.thor,
            "thor_first_order": self.thor,
            "thor_bert": self.thor_bert.thor,
            "thor_bert_baseline": self.thor_bert.baseline,
        }
        problems = []
        for recipe, space in self.study.tuning.spaces.items():
            lr = sections[recipe].lr
            for warmup, schedule in (("warmup_epochs", WarmupSchedule), ("warmup_steps", PolynomialSchedule)):
                if space.lr is not None and getattr(space.lr, warmup) is not None and not isinstance(lr, schedule):
                    problems.append(
                        (
                            f"study.tuning.spaces.{recipe}.lr.{warmup}",
                            f"is set, but {recipe}'s lr schedule (shape {lr.shape}) has no {warmup}",
                        )
                    )
        CrossKeyProblems.raise_if_any(problems)
        return self


class ParameterError(ValueError):
    """Parameters that are unknown, mistyped, out of range or inconsistent; one line per problem."""


def validate_parameters(raw: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> Parameters:
    """The merged configuration as ``Parameters``, or a ``ParameterError`` listing every problem.

    ``sources`` maps dotted keys to the file (or ``--params``) that last set them; each problem line
    ends with its key's source.
    """
    try:
        return Parameters.model_validate(raw)
    except ValidationError as error:
        lines = [
            f"  {key} {problem} ({_source(key, sources or {})})"
            for details in error.errors()
            for key, problem in _problems(details)
        ]
        raise ParameterError("invalid parameters:\n" + "\n".join(lines)) from None


def _problems(details: ErrorDetails) -> list[tuple[str, str]]:
    """(dotted key, problem) pairs of one pydantic error."""
    if details["type"] == "cross_key":
        return [(key, problem) for key, problem in details["ctx"]["problems"]]
    loc, parent = _resolve(details["loc"])
    key = _dotted(loc)
    if details["type"] == "extra_forbidden":
        return [(key, "is not a known parameter" + _suggestion(loc, parent))]
    if details["type"] == "missing":
        return [(key, "is missing")]
    if details["type"] in ("union_tag_invalid", "union_tag_not_found"):  # a schedule's shape
        ctx = details["ctx"]
        tags = _tagged_members(parent.model_fields[str(loc[-1])].annotation) if parent is not None else {}
        found = f"is {ctx['tag']!r}" if details["type"] == "union_tag_invalid" else "is missing"
        return [(f"{key}.{ctx['discriminator'].strip(chr(39))}", f"{found}; choose one of {', '.join(tags)}")]
    value, ctx = _yaml_text(details["input"]), details.get("ctx", {})
    if details["type"] == "literal_error":  # ctx: "'own' or 'mindspore'"
        allowed = ctx["expected"].replace(" or ", ", ").replace("'", "")
        return [(key, f"is {value}; choose one of {allowed}")]
    if details["type"] in _BOUNDS:
        bound, symbol = _BOUNDS[details["type"]]
        limit = ctx[bound]  # pydantic turns a float field's bound into a float: 0 -> 0.0
        return [(key, f"is {value} but must be {symbol} {int(limit) if float(limit).is_integer() else limit}")]
    if details["type"] in _TYPES:
        return [(key, f"is {value} but must be {_TYPES[details['type']]}")]
    message = details["msg"]  # the rest, e.g. "List should have at least 2 items after validation, not 1"
    return [(key, f"is {value}: {message[0].lower()}{message[1:]}")]


# pydantic error types -> the words of the problem lines
_BOUNDS = {
    "greater_than": ("gt", ">"),
    "greater_than_equal": ("ge", ">="),
    "less_than": ("lt", "<"),
    "less_than_equal": ("le", "<="),
}
_TYPES = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
}


def _resolve(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], type[BaseModel] | None]:
    """A pydantic location as its dotted key's parts, and the model holding its last part (None inside a list).

    Inside a discriminated union pydantic adds the member's tag to the location (``thor.lr.thor.power`` for the
    key ``thor.lr.power``): the tag is dropped, and the member it names is the model of the keys below it.
    """
    parts: list[int | str] = []
    model: type[BaseModel] | None = Parameters
    parent = model
    remaining = list(loc)
    while remaining:
        part = remaining.pop(0)
        parts.append(part)
        parent = model
        field = model.model_fields.get(str(part)) if model is not None and isinstance(part, str) else None
        annotation = field.annotation if field is not None else None
        members = _tagged_members(annotation)
        if members and remaining and remaining[0] in members:
            model = members[remaining.pop(0)]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
        else:
            model = None
    return tuple(parts), parent


def _tagged_members(annotation) -> dict[str, type[BaseModel]]:
    """Tag -> member model of a union of models told apart by a ``Literal`` field (``Schedule``: ``shape``)."""
    members = {}
    for member in get_args(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel) and "shape" in member.model_fields:
            members |= dict.fromkeys(get_args(member.model_fields["shape"].annotation), member)
    return members


def _suggestion(loc: tuple[int | str, ...], parent: type[BaseModel] | None) -> str:
    """``"; did you mean <key>?"`` with the closest known key of ``parent`` beside an unknown one, or ``""``."""
    if parent is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(parent.model_fields), n=1)
    return f"; did you mean {_dotted((*loc[:-1], close[0]))}?" if close else ""


def _dotted(loc: tuple[int | str, ...]) -> str:
    """A location as it is written in ``--params``: ``thor.lr.peak``, ``thor.trace_rule[1]``."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else part
    return text


def _source(key: str, sources: Mapping[str, str]) -> str:
    """Where ``key`` was set: a list item or an unknown mapping takes its nearest known key's source."""
    parts = key.split("[", 1)[0].split(".")
    while parts:
        dotted = ".".join(parts)
        if dotted in sources:
            return sources[dotted]
        below = next((source for name, source in sources.items() if name.startswith(dotted + ".")), None)
        if below is not None:
            return below
        parts.pop()
    return "unknown source"


def _yaml_text(value: Any) -> str:
    """A value as it is written in YAML (``null``, ``true``, ``'ten'``)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value)
