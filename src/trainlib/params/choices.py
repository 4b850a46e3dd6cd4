"""The choices of the parameters, each declared once: a ``Literal`` that the parameter models validate against
and the library reads its tuple from (``typing.get_args(DampingMethod)``), so a new choice is one edit here."""

from __future__ import annotations

from typing import Literal

DeviceTarget = Literal["CPU", "GPU", "Ascend"]  # trainlib.engine.runtime
ExecutionMode = Literal["graph", "pynative"]
DataSource = Literal["fashion_mnist", "folder"]
VerifyMode = Literal["none", "header", "decode"]  # trainlib.data.verify
BadFilePolicy = Literal["exclude", "fail"]  # trainlib.data.folder
# trainlib.models.resnet.RESNET_LAYOUTS holds a layout for each name
NetworkName = Literal["resnet18", "resnet34", "resnet50", "resnet101", "resnet_narrow"]
Initialiser = Literal["he_normal", "xavier_uniform", "truncated_normal"]  # trainlib.models.resnet
GradCentralization = Literal["auto", "on", "off"]
# the layouts with a torchvision counterpart (trainlib.migrate): the 7x7 stem with max-pool and 64 base channels
TorchvisionArchitecture = Literal["resnet18", "resnet34", "resnet50", "resnet101"]
AmpLevel = Literal["O0", "O1", "O2", "O3"]
# trainlib: this project's implementation | mindspore_builtin: MindSpore's built-in one (mindspore.nn.thor,
# mindspore.boost)
Implementation = Literal["trainlib", "mindspore_builtin"]
AdasumExchange = Literal["allgather", "allreduce"]  # trainlib.optim.adasum.combine
# fixed: a fixed sqrt(damping) added to each factor, as mindspore.nn.thor does | factored: Martens & Grosse's split
DampingMethod = Literal["fixed", "factored"]  # trainlib.optim.thor
ComputeMethod = Literal["inverse", "eigen"]  # trainlib.optim.thor
# the dtype of the GEMMs that take THOR's A and G (stored as float32 either way): float64's bits do not depend on the
# cores or the L2 cache, float32 (oneDNN) splits its sums by the L2 cache size (docs/troubleshooting.md#thor-cpu)
StatisticsDtype = Literal["float32", "float64"]  # trainlib.optim.thor.capture
# none | median: a trial behind the median of earlier trials at a step evaluation | successive_halving: Optuna's
# (asynchronous) successive halving, rungs at a ninth and a third of a training | hyperband: Optuna's brackets of
# such rungs from the first step evaluation on (trainlib.study.tuning_search.create_pruner)
Pruner = Literal["none", "median", "successive_halving", "hyperband"]
# the Momentum recipes' schedules (trainlib.optim.schedules); the other shapes are one schedule model each
WarmupShape = Literal["linear", "cosine", "quadratic", "steps", "constant"]

# MindSpore registers the Centralization kernel in its Ascend plugin only: on CPU the compilation fails with
# "Kernel select failed: Centralization"; the GPU plugins have no such kernel (trainlib.boost.options).
GRAD_CENTRALIZATION_TARGETS = ("Ascend",)
# mindspore.boost's Adasum runs on Ascend with 16 devices or more (Send/Receive between 8-device servers).
BUILTIN_ADASUM_MIN_DEVICES = 16
