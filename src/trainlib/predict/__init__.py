"""A trained network others can use: exported to MindIR with what a prediction needs beside it (``export``), a
fill-mask model's example input (``fill_mask``), and the images a prediction reads and how well it scored
(``images``). The loaded model itself is ``mindir_serving`` (shipped inside every MLflow model); the ``predict``
pipeline and the MLflow model of every training run (``pipelines.tracking.models``) use it: docs/use-a-model.md."""
