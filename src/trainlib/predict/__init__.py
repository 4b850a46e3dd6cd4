"""A trained classifier others can use: its network exported to MindIR with what a prediction needs beside it
(``export``), and the loaded model that turns encoded images into the top classes and their probabilities
(``classifier``). The ``predict`` pipeline and the MLflow model of every training run (``pipelines.tracking.models``)
both call them; docs/use-a-model.md."""
