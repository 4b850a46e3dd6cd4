"""``data`` pipeline: ingest an ImageNet-style tree into a manifest, the modular pipeline ``data``."""

from kedro.pipeline import Pipeline, node, pipeline

from pipelines.modular import namespaced

from .nodes import build_manifest, locate_image_tree


def create_pipeline(**kwargs) -> Pipeline:
    """Nodes ``data.locate_image_tree``, ``data.build_manifest``; ``manifest`` and ``class_index`` keep their
    names (every training reads them), the rest is ``data.…``."""
    template = pipeline(
        [
            node(locate_image_tree, "params:data", "image_root", name="locate_image_tree"),
            node(
                build_manifest,
                ["image_root", "params:data"],
                ["manifest", "class_index", "class_counts", "bad_files"],
                name="build_manifest",
            ),
        ]
    )
    return namespaced(template, "data", outputs={"manifest": "manifest", "class_index": "class_index"})
