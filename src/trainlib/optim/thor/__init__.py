"""THOR: K-FAC style second-order training as a gradient preconditioner before the baseline's Momentum.

Modules, in kfac-pytorch's shape: ``linalg`` (block inverses and products, graph-safe), ``capture`` (the layer
wrappers that record A and G), ``curvature`` with ``inverse`` and ``eigen`` (the two compute methods), ``graft`` and
``clip`` (the steps after them), ``preconditioner`` (``ThorPreconditioner``: statistics, the chosen method, trace
rule, counters, state), ``step`` (``ThorStep``: forward, backward, precondition, the shared optimizer), and
``mindspore_thor`` (MindSpore's own ``nn.thor``, Ascend/GPU).

The shape is kfac-pytorch's: forward, backward, ``ThorPreconditioner`` rewrites the gradients of the
supported layers, then an ordinary optimizer (``create_thor_step``: the baseline's ``create_momentum``,
with its weight-decay groups) applies weight decay and momentum. ``ThorStep`` is that step as one
callable ``(images, labels) -> loss``, compiled as a cell that calls ``optimizer(precondition(grads))``.
So momentum, weight decay and their checkpointed state are the baseline's; the preconditioner adds its
statistics, inverses and counters (``ThorPreconditioner.state``).

``mindspore.nn.thor`` needs Ascend/GPU-only kernels (ThorIm2Col, CholeskyTrsm, UpdateThorGradient);
this preconditioner uses only ``ops.unfold``, ``ops.cholesky``, ``ops.cholesky_solve``, ``InsertGradientOf``
and matmuls, so it runs in GRAPH mode on CPU and GPU; on Ascend, where MindSpore 2.10 documents no
``ops.cholesky``, the inverses default to ``ops.MatrixInverse`` (only CPU was available to test this module).

Per ``nn.Conv2d`` (group 1) and ``nn.Dense`` (without activation) of the network, with ``N`` the
batch size, ``P`` the output positions per example (``H_out * W_out`` for a conv, 1 for a dense
layer) and ``lambda`` the damping of the step:

* ``A = E[a a^T]`` over the layer input: for a conv, ``a`` are the im2col patches (``ops.unfold`` on
  the input padded as the conv pads it, honouring stride and dilation), each ``C_in*kh*kw`` long and
  ordered like ``weight.reshape(C_out, -1)``; averaged over the ``N * P`` rows.
* ``G = E[g g^T]`` over the gradient w.r.t. the layer OUTPUT, ``C_out`` square, averaged over the
  ``N * P`` rows, where ``g = N * dout / loss_scale`` and ``dout`` is the gradient of the loss-scaled
  batch-mean loss. ``N * dL_mean/dout`` is the per-example gradient, so ``G`` is the Fisher factor:
  this is RECIPES' ``G * (batch / loss_scale)^2`` convention, applied when the statistic is taken.
* Damped inverses (``s = sqrt(lambda / P)``): ``A^-1 = P^-1/2 (A + s I)^-1``, ``G^-1 = P^-1/2 (G + s I)^-1``,
  by Cholesky (``ops.cholesky`` + ``ops.cholesky_solve`` against the identity; ``MatrixInverse`` on
  Ascend, see ``block_inverse``), of the full matrices or, with ``block_size``, of each
  ``block_size`` square diagonal block separately (the last block padded with the identity).
  RECIPES' "conv: damping normalised by the patch count" is read as MindSpore's own THOR does it:
  the Ascend optimizer multiplies the damping by ``batch_size / a_normalizer`` with
  ``a_normalizer = N * H_out * W_out`` im2col rows, the GPU one divides it by ``H_out * W_out``;
  both give ``lambda / P``, and both multiply each conv inverse by ``P^-1/2``. So the layer's
  Fisher is ``P * A (x) G`` (K-FAC for convolutions, spatially independent gradients) with each
  factor damped by ``sqrt(lambda)``: the update is
  ``(sqrt(P) G + sqrt(lambda) I)^-1 grad (sqrt(P) A + sqrt(lambda) I)^-1``. For a dense layer
  ``P = 1``: plainly ``(G + sqrt(lambda) I)^-1 grad (A + sqrt(lambda) I)^-1``.
* Update direction ``d = G^-1 grad A^-1`` with ``grad`` reshaped to ``C_out x (C_in*kh*kw)``;
  BatchNorm parameters, biases and unsupported layers use the plain gradient. Then the optimizer:
  for the baseline's Momentum, weight decay is added (after preconditioning; not on names containing
  beta/gamma/bias, ``optim.momentum.decay_groups``), then ``m = momentum * m + d``, ``w = w - lr * m``.

How the statistics are captured: THOR replaces each supported layer in the network by a
transparent ``CapturedLayer`` cell (``capture``) (the layer's parameters and names are unchanged). While its
``capture`` flag is on, it computes ``A`` from its input in the forward pass and wraps its output in
``ops.InsertGradientOf`` whose hook computes ``G`` from the output gradient during the backward pass;
both are written to non-trainable parameters of the wrapper (``thor_stats.<weight name>.A/G/P``;
they therefore appear in ``net.get_parameters()``; ``is_statistic`` tells them apart from the
weights, so checkpoints store them with the optimizer state), which the preconditioner reads after the
gradients exist (``ops.depend`` orders them). An alternative, differentiating w.r.t. zero "probe"
tensors added to each layer output, would need the output shapes (batch included) fixed up front
and still a side channel for ``A``; the hook keeps the network's call signature. The flag is a
Python attribute, read when a graph is compiled: THOR compiles two step cells, the "second-order"
one with capture on (statistics, inverses and update in one graph) and the "reuse" one with capture
off (the forward/backward of plain training plus two matmuls per layer with the stored inverses),
each followed by the same optimizer.
``frequency`` picks the variant per step; neither ever retraces. With the flag off the wrapper is
the bare layer, so evaluation graphs compiled on the same network carry no statistics.

Trace rule (THOR paper, optional ``trace_rule=(skip, stop)``): at a second-order step a layer's
``t = tr(A + sI) * tr(G + sI)`` (the trace of the damped Kronecker factor product, before the
``P^-1/2`` scaling) is compared with ``t_ref``, its value when the layer's inverses were last
recomputed: relative change ``|t - t_ref| / t_ref`` above ``skip`` recomputes (and sets
``t_ref = t``); at most ``skip`` keeps the old inverses for this step; below ``stop`` keeps them for
good (the layer is never refreshed again). Every layer is computed at its first second-order step.
Comparing with the last refresh rather than the previous check lets slow drift trigger a refresh.
The rule saves the work it skips: with a trace rule a second-order step runs in three parts, the
forward/backward with statistics capture (returning the gradients and every layer's ``t``), the
decision per layer on the host, one compiled damped inversion per refreshed layer only, then the
reuse step's preconditioning with the stored inverses and the optimizer. (One fused graph cannot skip
work: MindSpore computes both branches of an ``ops.where``.) ``trace_skips`` counts (layer,
second-order step) pairs that kept old inverses, ``inverses_computed`` the (layer, step) pairs whose
A and G inverses were computed; without a trace rule every layer is computed at every second-order
step, in the one fused graph.

Options (issue 29), each off by default: ``damping_method`` (fixed or factored), ``compute_method`` (inverse or
eigen), ``adam_graft``, ``kl_clip``, and ``statistics_dtype`` (issue 44); their maths: see docs/recipes.md, section
"THOR's options". The compute method is one cell chosen at construction (``inverse.InverseMethod``,
``eigen.EigenMethod``, as kfac-pytorch's ``KFACInverseLayer`` and ``KFACEigenLayer``), and the graft
(``graft.AdamGraft``) and the clip (``clip.KlClip``) are steps after it, each holding only its own buffers; with
every option off the compiled graphs are the ones above.

Loss scale: the loss is multiplied by ``loss_scale`` before differentiation (like
``TrainOneStepCell(sens=loss_scale)``); gradients are divided by it before the preconditioner and ``G``
is unscaled as above, so the optimizer gets loss scale 1 and updates do not depend on it (exactly, for
powers of two).

Data parallel (``rank_size > 1``, after ``init()`` under msrun): gradients, the loss and the A/G
statistics are averaged across ranks with ``ops.AllReduce`` before use, so all ranks hold the same
inverses and apply the same update. (Not exercised by the tests: that needs msrun.)

Everything is float32; the network must not be cast to float16 (amp O2/O3). ``statistics_dtype: float64`` takes the
products of A and G in float64 and rounds them to float32, so that THOR's statistics do not depend on how many threads
the CPU's cores and L2 cache size give float32's oneDNN GEMM (``capture``); its figures still depend on the CPU family
(AVX-512 or AVX2 only: docs/troubleshooting.md#thor-cpu).
"""
