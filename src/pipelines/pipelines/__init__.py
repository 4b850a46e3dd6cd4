"""The Kedro pipelines, one folder each, named as registered (``kedro run --pipelines=<name>``)."""
