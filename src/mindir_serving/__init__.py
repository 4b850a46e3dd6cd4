"""What a trained model's MLflow model runs, shipped inside the model (MLflow's ``code_paths``): the MindIR loader, the
evaluation's image decode and resize, the BERT tokenizer's special tokens, and the pyfunc. It imports only the
model's requirements (``pyfunc.REQUIREMENTS``) and itself, so a logged model loads in a Python that has those and not
this project: docs/use-a-model.md. The training library builds on it (``trainlib.data.folder`` evaluates with
``images.eval_image_ops``), so the evaluation and every logged model run one definition of the pixels."""
