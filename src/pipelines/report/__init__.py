"""``report`` pipeline: compare the recipes' MLflow runs in a table and figures."""
