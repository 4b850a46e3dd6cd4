"""Momentum with Nesterov's look-ahead: an example of a recipe kept in a package of its own.

``spec`` declares it (its section's model and its ``RecipeSpec``, found through the entry point in
``pyproject.toml``), ``train`` trains its section on the project's engine, ``pipeline`` is its Kedro pipeline (the
project's image template). Its configuration goes in the project's ``conf/local/parameters_nesterov.yml``.
"""
