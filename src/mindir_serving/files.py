"""A model folder's files and the two tasks a model performs (``trainlib.predict.export`` writes the folders)."""

MINDIR_FILE = "network.mindir"
DESCRIPTION_FILE = "model.json"
EXAMPLE_FILE = "example_input"
IMAGE_CLASSIFICATION = "image_classification"
FILL_MASK = "fill_mask"
