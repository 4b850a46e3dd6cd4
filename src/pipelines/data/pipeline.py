"""``data`` pipeline: ingest an ImageNet-style tree into a manifest, the modular pipeline ``data``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import build_manifest


def create_pipeline(**kwargs) -> Pipeline:
    """Node ``data.build_manifest``: the tree ``params:data`` names (the default data written out on first use),
    scanned into ``manifest`` and ``class_index``, which keep their names (every training reads them), and the
    ``data.…`` reports. One node from the parameters: ``kedro run --nodes=data.build_manifest`` has every input."""
    template = pipeline(
        [
            node(
                build_manifest,
                "params:data",
                ["manifest", "class_index", "class_counts", "bad_files"],
                name="build_manifest",
            ),
        ]
    )
    return namespaced(template, "data", outputs={"manifest": "manifest", "class_index": "class_index"})
