"""PyTorch -> MindSpore migration of a torchvision-layout ResNet, with the two parity checks of a migration.

``convert`` maps a torchvision ``state_dict`` (``conv1``, ``bn1``, ``layer1.0.conv1`` …, ``fc``) onto
this project's ResNet (``stem.0``, ``stem.1``, ``layers.<k>.conv1`` …, ``fc``). Layouts need no
transposition: a convolution is (out, in, kh, kw) and a dense weight (out, in) in both frameworks.
BatchNorm ``weight``/``bias``/``running_mean``/``running_var`` become
``gamma``/``beta``/``moving_mean``/``moving_variance``; ``num_batches_tracked`` has no MindSpore
counterpart and is dropped (with momentum set it is only a counter). Both frameworks use eps 1e-5,
and PyTorch's momentum 0.1 is MindSpore's 0.9 (the weight of the old statistic).

Then, as a migration guide's "single-step reproduction" asks, two checks on a fixed seeded input:

- ``forward_parity``: logits of both networks in inference mode (BatchNorm on its moving statistics);
- ``single_step_parity``: one plain SGD step (no momentum, no weight decay) on the same batch with
  training-mode BatchNorm, then every parameter and moving statistic compared.

PyTorch is needed only for ``load_state_dict`` and the parity checks (``torch_resnet``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from trainlib.engine.checkpoint import Checkpoint
from trainlib.migrate.layouts import TORCH_INSTALL_HINT, TORCHVISION_ARCHITECTURES
from trainlib.models.loss import CrossEntropySmooth
from trainlib.models.resnet import RESNET_LAYOUTS, ResNetLayout
from trainlib.params import MigrationParity

DROPPED_SUFFIXES = (".num_batches_tracked",)
_BN_NAMES = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}
_STEM_MODULES = {"0": "conv1", "1": "bn1"}
_LISTED = 8  # names shown per kind of problem in an error
# A ReLU input this close to zero, relative to its tensor's largest magnitude, is within a few float32
# rounding steps of the kink: the two frameworks may put it on different sides.
KINK_MARGIN = 1e-6
_STEP_COLUMNS = (
    "weight_max_abs_diff",
    "weight_max_rel_diff",
    "update_max_rel_diff",
    "mindspore_update_error",
    "torch_float32_update_error",
)


class MigrationError(ValueError):
    """A PyTorch state_dict that does not fit the chosen architecture, or an unreadable file."""


def torch_name(mindspore_name: str, layout: ResNetLayout) -> str:
    """torchvision's ``state_dict`` key for the parameter ``mindspore_name`` of our ResNet of ``layout``.

    Our blocks are numbered through all stages (``layers.<k>``); torchvision numbers them per stage
    (``layer<stage>.<block>``).
    """
    parts = mindspore_name.split(".")
    leaf = _BN_NAMES.get(parts[-1], parts[-1])
    if parts[0] == "fc":
        return mindspore_name
    if parts[0] == "stem":
        return f"{_STEM_MODULES[parts[1]]}.{leaf}"
    index = int(parts[1])
    for stage, n_blocks in enumerate(layout.blocks_per_stage):
        if index < n_blocks:
            modules = ["downsample" if m == "down_sample" else m for m in parts[2:-1]]
            return ".".join([f"layer{stage + 1}", str(index), *modules, leaf])
        index -= n_blocks
    raise ValueError(f"{mindspore_name} is beyond the {sum(layout.blocks_per_stage)} blocks of the layout")


def mindspore_parameter_shapes(architecture: str, num_classes: int) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter (moving statistics included) of our ``architecture``."""
    from trainlib.models.resnet import create_resnet

    return {p.name: tuple(p.shape) for p in create_resnet(architecture, num_classes).get_parameters()}


def _check_architecture(architecture: str) -> ResNetLayout:
    if architecture not in TORCHVISION_ARCHITECTURES:
        raise MigrationError(
            f"architecture {architecture!r} has no torchvision counterpart; choose one of {TORCHVISION_ARCHITECTURES}"
        )
    return RESNET_LAYOUTS[architecture]


def convert(
    state_dict: Mapping[str, np.ndarray], architecture: str, num_classes: int, source: str = "the state_dict"
) -> Checkpoint:
    """Our ResNet's checkpoint from a torchvision ``state_dict`` (name -> array) of the same architecture.

    Every problem is reported at once, naming ``source`` and the keys: missing, unexpected
    (``num_batches_tracked`` is expected and dropped) and mis-shaped ones. Arrays become float32.
    """
    layout = _check_architecture(architecture)
    expected = {
        torch_name(name, layout): (name, shape)
        for name, shape in mindspore_parameter_shapes(architecture, num_classes).items()
    }
    kept = {k: v for k, v in state_dict.items() if not k.endswith(DROPPED_SUFFIXES)}
    missing = sorted(set(expected) - set(kept))
    unexpected = sorted(set(kept) - set(expected))
    reshaped = [
        f"{key} has shape {tuple(np.shape(kept[key]))}, {architecture} with {num_classes} classes needs "
        f"{expected[key][1]}"
        for key in sorted(set(expected) & set(kept))
        if tuple(np.shape(kept[key])) != expected[key][1]
    ]
    problems = []
    if missing:
        problems.append(
            f"missing keys {missing[:_LISTED]}"
            + (f" and {len(missing) - _LISTED} more" if len(missing) > _LISTED else "")
        )
    if unexpected:
        problems.append(
            f"unexpected keys {unexpected[:_LISTED]}"
            + (f" and {len(unexpected) - _LISTED} more" if len(unexpected) > _LISTED else "")
        )
    problems.extend(reshaped[:_LISTED])
    if problems:
        raise MigrationError(f"{source} is not a torchvision {architecture} state_dict: " + "; ".join(problems))
    params = {name: np.asarray(kept[key], dtype=np.float32) for key, (name, _) in expected.items()}
    return Checkpoint(params, {"network": architecture, "num_classes": num_classes, "migrated_from": str(source)})


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
    """The tensors of a ``.pth`` file written by ``torch.save(model.state_dict(), path)``.

    A dict holding the state_dict under ``model`` or ``state_dict`` (training checkpoints) is
    unwrapped. Floating tensors become float32 arrays. Needs PyTorch.
    """
    try:
        import torch
    except ImportError as error:
        raise ImportError(TORCH_INSTALL_HINT) from error
    path = Path(path)
    if not path.is_file():
        raise MigrationError(
            f"PyTorch state_dict {path} does not exist; write one with torch.save(model.state_dict(), path)"
        )
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises UnpicklingError, RuntimeError or EOFError alike
        raise MigrationError(f"{path} is not a readable PyTorch state_dict file: {error}") from error
    for wrapper in ("model", "state_dict"):
        if isinstance(loaded, Mapping) and isinstance(loaded.get(wrapper), Mapping):
            loaded = loaded[wrapper]
    if not isinstance(loaded, Mapping) or not loaded:
        raise MigrationError(f"{path} holds {type(loaded).__name__}, not a state_dict (parameter name -> tensor)")
    not_tensors = sorted(k for k, v in loaded.items() if not isinstance(v, torch.Tensor))
    if not_tensors:
        raise MigrationError(f"{path}: entries {not_tensors[:_LISTED]} are not tensors; is this a state_dict?")
    return {
        k: (v.detach().float() if v.is_floating_point() else v.detach()).contiguous().numpy().copy()
        for k, v in loaded.items()
    }


@dataclass(frozen=True)
class ParityInput:
    """The fixed input of both checks: ``batch_size`` images of ``image_size`` x ``image_size`` pixels, drawn
    with their labels from ``seed``."""

    image_size: int
    batch_size: int
    seed: int

    def arrays(self, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
        """Standard-normal NCHW float32 images and int32 labels below ``num_classes``."""
        rng = np.random.default_rng(self.seed)
        images = rng.standard_normal((self.batch_size, 3, self.image_size, self.image_size)).astype(np.float32)
        return images, rng.integers(0, num_classes, self.batch_size).astype(np.int32)


def _torch_model(state_dict: Mapping[str, np.ndarray], architecture: str, num_classes: int):
    import torch

    from trainlib.migrate.torch_resnet import TorchResNet

    model = TorchResNet(architecture, num_classes)
    tensors = {k: torch.from_numpy(np.array(v)) for k, v in state_dict.items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # Old state_dicts lack num_batches_tracked; it plays no part with momentum set.
    missing = [k for k in missing if not k.endswith(DROPPED_SUFFIXES)]
    if missing or unexpected:
        raise MigrationError(
            f"state_dict does not fit torchvision {architecture}: missing {missing}, unexpected {unexpected}"
        )
    return model


def _mindspore_net(checkpoint: Checkpoint, architecture: str, num_classes: int):
    from trainlib.engine.state import restore_state
    from trainlib.models.resnet import create_resnet

    net = create_resnet(architecture, num_classes)
    restore_state(net, checkpoint)
    return net


def forward_parity(
    state_dict: Mapping[str, np.ndarray],
    checkpoint: Checkpoint,
    architecture: str,
    num_classes: int,
    batch: ParityInput,
) -> dict[str, float]:
    """Largest absolute difference between PyTorch's and MindSpore's logits in inference mode.

    Returns ``max_abs_diff`` and, for scale, ``max_abs_logit`` (PyTorch's largest logit magnitude).
    """
    import mindspore as ms
    import torch

    images, _ = batch.arrays(num_classes)
    model = _torch_model(state_dict, architecture, num_classes).eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(images)).numpy()
    net = _mindspore_net(checkpoint, architecture, num_classes)
    net.set_train(False)
    logits = net(ms.Tensor(images)).asnumpy()
    return {"max_abs_diff": float(np.abs(logits - expected).max()), "max_abs_logit": float(np.abs(expected).max())}


def _max_rel(diff: np.ndarray, reference: np.ndarray) -> float:
    """``max|diff| / max|reference|``; 0 when both are all zero."""
    scale = float(np.abs(reference).max())
    worst = float(np.abs(diff).max())
    return worst / scale if scale > 0 else (0.0 if worst == 0 else float("inf"))


def _torch_step(
    state_dict: Mapping[str, np.ndarray],
    architecture: str,
    num_classes: int,
    images: np.ndarray,
    labels: np.ndarray,
    lr: float,
    dtype,
) -> tuple[float, dict[str, np.ndarray], int]:
    """PyTorch's loss and state (float64 arrays) after one plain SGD step in ``dtype``, and its near kinks.

    Near kinks: ReLU inputs within ``KINK_MARGIN`` of zero, relative to their tensor's largest
    magnitude. There the loss has no derivative, and float32 rounding decides which one-sided
    gradient a framework takes.
    """
    import torch

    model = _torch_model(state_dict, architecture, num_classes).to(dtype).train()
    near_kinks = 0

    def count_near_kinks(_module, inputs) -> None:
        nonlocal near_kinks
        values = inputs[0].detach().abs()
        near_kinks += int((values <= KINK_MARGIN * values.max()).sum() - (values == 0).sum())

    hooks = [m.register_forward_pre_hook(count_near_kinks) for m in model.modules() if isinstance(m, torch.nn.ReLU)]
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0, weight_decay=0.0)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(images).to(dtype)), torch.from_numpy(labels).long())
    for hook in hooks:
        hook.remove()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    state = {k: v.detach().double().numpy() for k, v in model.state_dict().items()}
    return float(loss.detach()), state, near_kinks


def single_step_parity(
    state_dict: Mapping[str, np.ndarray],
    checkpoint: Checkpoint,
    architecture: str,
    num_classes: int,
    batch: ParityInput,
    lr: float,
) -> tuple[dict[str, float], pd.DataFrame]:
    """One SGD step (``lr``, mean cross-entropy, training-mode BatchNorm) in both frameworks, compared.

    A weight's relative difference is ``max|w_ms - w_torch| / max|w_torch|`` over the tensor; an
    update's is the same for ``w_after - w_before``, which catches a wrong gradient however small
    ``lr`` makes the step. PyTorch also takes the step in float64, the reference that tells how far
    float32 itself is from exact: a randomly initialised deep network can be so ill-conditioned that
    PyTorch's own float32 update is off by percents (ResNet-50 at 64 px), and then no float32
    implementation can match it closely. Returns the summary (``loss_torch``, ``loss_mindspore``,
    ``weight_max_abs_diff``, ``weight_max_rel_diff``, ``update_max_rel_diff``, ``worst_tensor``,
    ``mindspore_update_error`` and ``torch_float32_update_error``: the worst relative update error
    against float64 of each; ``near_kink_activations``, see ``_torch_step``) and one row per tensor.
    """
    import mindspore as ms
    import torch
    from mindspore import nn

    images, labels = batch.arrays(num_classes)
    torch_loss, torch_after, _ = _torch_step(state_dict, architecture, num_classes, images, labels, lr, torch.float32)
    _, exact_after, near_kinks = _torch_step(state_dict, architecture, num_classes, images, labels, lr, torch.float64)

    net = _mindspore_net(checkpoint, architecture, num_classes)
    # Copies: a MindSpore tensor made from a numpy array may share its memory, and the step updates in place.
    before_step = {name: np.array(value, dtype=np.float64) for name, value in checkpoint.params.items()}
    net.set_train(True)
    # the recipes' dense cross entropy: the sparse primitive is declared for GPU and CPU only (docs/backends.md)
    step = nn.TrainOneStepCell(
        nn.WithLossCell(net, CrossEntropySmooth(num_classes, 0.0)),
        nn.SGD(net.trainable_params(), learning_rate=lr, momentum=0.0, weight_decay=0.0),
    )
    ms_loss = float(step(ms.Tensor(images), ms.Tensor(labels)).asnumpy())

    layout = RESNET_LAYOUTS[architecture]
    rows = []
    for param in net.get_parameters():
        key = torch_name(param.name, layout)
        before, after = before_step[param.name], param.asnumpy().astype(np.float64)
        expected, exact = torch_after[key], exact_after[key]
        rows.append(
            {
                "mindspore_name": param.name,
                "torch_name": key,
                "shape": "x".join(map(str, param.shape)),
                "weight_max_abs_diff": float(np.abs(after - expected).max()),
                "weight_max_rel_diff": _max_rel(after - expected, expected),
                "update_max_abs_torch": float(np.abs(expected - before).max()),
                "update_max_rel_diff": _max_rel(after - expected, expected - before),
                "mindspore_update_error": _max_rel(after - exact, exact - before),
                "torch_float32_update_error": _max_rel(expected - exact, exact - before),
            }
        )
    table = pd.DataFrame(rows)
    worst = table.loc[table["update_max_rel_diff"].idxmax()]
    summary = {
        "loss_torch": torch_loss,
        "loss_mindspore": ms_loss,
        **{column: float(table[column].max()) for column in _STEP_COLUMNS},
        "worst_tensor": str(worst["mindspore_name"]),
        "near_kink_activations": near_kinks,
    }
    return summary, table


def check_parity(
    state_dict: Mapping[str, np.ndarray],
    checkpoint: Checkpoint,
    architecture: str,
    num_classes: int,
    parity: MigrationParity,
) -> tuple[dict, pd.DataFrame]:
    """Both checks with the settings and bounds of ``parity`` (a ``migrate.parity`` parameters section).

    Returns the report (each check's figures, its bounds and ``passed``; ``passed`` overall) and the
    single step's per-tensor table. Forward: ``forward_tolerance`` bounds the largest absolute logit
    difference. Single step: the weights after the step are at parity when the largest absolute weight
    difference is within ``step_weight_tolerance`` and the largest relative update difference within
    ``step_update_tolerance`` (``criterion: pytorch_float32``), or, where float32 cannot be that close
    to exact, when MindSpore's update error against PyTorch's float64 step is at most
    ``step_noise_factor`` times PyTorch's own float32 error (``criterion: float32_noise``).
    """
    batch = ParityInput(parity.image_size, parity.batch_size, parity.seed)
    forward = forward_parity(state_dict, checkpoint, architecture, num_classes, batch)
    forward["tolerance"] = parity.forward_tolerance
    forward["passed"] = forward["max_abs_diff"] <= parity.forward_tolerance
    step, table = single_step_parity(state_dict, checkpoint, architecture, num_classes, batch, lr=parity.lr)
    step.update(
        lr=parity.lr,
        weight_tolerance=parity.step_weight_tolerance,
        update_tolerance=parity.step_update_tolerance,
        noise_factor=parity.step_noise_factor,
    )
    close = (
        step["weight_max_abs_diff"] <= parity.step_weight_tolerance
        and step["update_max_rel_diff"] <= parity.step_update_tolerance
    )
    within_noise = step["mindspore_update_error"] <= parity.step_noise_factor * step["torch_float32_update_error"]
    step["criterion"] = "pytorch_float32" if close else "float32_noise" if within_noise else "none"
    step["passed"] = close or within_noise
    report = {
        "architecture": architecture,
        "num_classes": num_classes,
        "input": {**asdict(batch), "layout": "NCHW float32, standard normal"},
        "forward": forward,
        "single_step": step,
        "passed": forward["passed"] and step["passed"],
    }
    return report, table


def require_parity(report: dict) -> None:
    """Raise ``MigrationError`` naming each check of ``report`` (from ``check_parity``) that failed."""
    failed = []
    forward, step = report["forward"], report["single_step"]
    if not forward["passed"]:
        failed.append(f"forward: max |logit difference| {forward['max_abs_diff']:.3g} > {forward['tolerance']:.3g}")
    if not step["passed"]:
        failed.append(
            f"single step: max |weight difference| {step['weight_max_abs_diff']:.3g} "
            f"(bound {step['weight_tolerance']:.3g}), max relative update difference "
            f"{step['update_max_rel_diff']:.3g} (bound {step['update_tolerance']:.3g}, worst {step['worst_tensor']}); "
            f"MindSpore's update error against float64 {step['mindspore_update_error']:.3g} is above "
            f"{step['noise_factor']:g} x PyTorch's float32 error {step['torch_float32_update_error']:.3g}"
        )
        if step["near_kink_activations"]:
            failed.append(
                f"{step['near_kink_activations']} ReLU input(s) of this batch lie within float32 rounding of zero, "
                "where the loss has no derivative and each framework may take a different one-sided gradient: "
                "try another migrate.parity.seed"
            )
    if failed:
        raise MigrationError(f"{report['architecture']} migration is not at parity: " + "; ".join(failed))
