"""The recipes' training set-ups as library code (no Kedro, no MLflow): network, data, step, ``engine.loop.train``.

``common``: what every recipe builds the same way (network, data, evaluation of a checkpoint);
``momentum``: the Momentum recipe (baseline, adasum, dim_reduce stage 1 and control, boost options).
Pipeline nodes unpack their typed parameters, call a recipe and log what it returns.
"""
