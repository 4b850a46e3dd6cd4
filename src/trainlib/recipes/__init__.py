"""The recipes' training set-ups as library code (no Kedro, no MLflow): network, data, step, ``engine.loop.train``.

``classifier``: what every image recipe builds the same way (network, data, evaluation of a checkpoint);
``momentum``: the Momentum recipe (baseline, adasum, dim_reduce stage 1 and control, boost options);
``thor``: THOR on ResNet; ``dim_reduce``: its stages; ``thor_bert``: THOR and its first-order baseline on BERT;
``registry``: which of them trains a given image recipe section. Pipeline nodes unpack their typed parameters,
call a recipe and log what it returns.
"""
