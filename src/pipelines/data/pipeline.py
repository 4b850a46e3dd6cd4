"""``data`` pipeline: ingest an ImageNet-style tree into a manifest."""

from kedro.pipeline import Pipeline, node, pipeline

from .nodes import build_manifest, locate_image_tree


def create_pipeline(**kwargs) -> Pipeline:
    return pipeline(
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
