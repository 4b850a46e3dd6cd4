"""``pipelines.catalog.CSVDataset``: every CSV file of the catalog, its floats as people read them."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from pipelines.catalog import CSVDataset

CATALOG = Path(__file__).parents[2] / "conf/base/catalog.yml"


def test_floats_are_saved_with_six_significant_digits_and_load_back(tmp_path):
    dataset = CSVDataset(filepath=str(tmp_path / "runs.csv"), save_args={"sep": ";"})
    dataset.save(pd.DataFrame({"result": ["thor"], "train_time_s": [625.8682556999393], "seed": [0]}))
    assert (tmp_path / "runs.csv").read_text() == "result;train_time_s;seed\nthor;625.868;0\n"
    assert CSVDataset(filepath=str(tmp_path / "runs.csv"), load_args={"sep": ";"}).load().at[0, "train_time_s"] == (
        625.868
    )


def test_every_csv_file_of_the_catalog_is_written_by_it():
    entries = yaml.safe_load(CATALOG.read_text())
    csv = {name: entry["type"] for name, entry in entries.items() if str(entry.get("filepath", "")).endswith(".csv")}
    assert csv and set(csv.values()) == {"pipelines.catalog.CSVDataset"}, csv


def test_a_table_without_rows_writes_no_file_when_the_entry_says_so(tmp_path):
    """``write_empty: false``: no header-only file, an earlier run's file removed, an empty table loaded back; by
    default an empty table is still written, header and all."""
    path = tmp_path / "explained_variance.csv"
    dataset = CSVDataset(filepath=str(path), write_empty=False)
    dataset.save(pd.DataFrame({"component": [1], "explained_variance_ratio": [0.6]}))
    assert path.read_text() == "component,explained_variance_ratio\n1,0.6\n"
    dataset.save(pd.DataFrame(columns=["component", "explained_variance_ratio"]))
    assert not path.exists() and CSVDataset(filepath=str(path), write_empty=False).load().empty
    CSVDataset(filepath=str(path)).save(pd.DataFrame(columns=["component"]))
    assert path.read_text() == "component\n"
