"""``predict`` pipeline: classify images with a trained model from MLflow."""
