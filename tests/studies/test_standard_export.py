"""examples/budgetformer/budget_research/standard_export.py: the two standard BERTs compute
the same classifier (one with torch's fused attention, one written as Hugging Face writes
it), their exports compute what they compute, and the study's ratios are its recorded
figures."""

import shutil

import numpy as np
import pytest
import torch

from budget_plugin.data.bert_files import open_input, read_config, read_weights
from budget_plugin.tools.tiny_bert import TINY, write_bert
from budget_research import standard_export
from budget_research.standard_export import SESSIONS, StandardBert, ratios, report, standard_export_study
from helpers import assert_close

# the study feeds ids from 1000 up, at up to 64 pieces
CONFIG = {**TINY, "vocab_size": 20000, "max_position_embeddings": 80}


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_bert(tmp_path_factory.mktemp("bert"), CONFIG)


def test_both_standard_berts_and_their_exports_compute_the_same_classifier(bert, tmp_path):
    source = open_input(bert)
    geometry, (_, weights) = read_config(source), read_weights(source)
    ids = torch.randint(1000, 20000, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = StandardBert(weights, geometry, hf_style=False)(ids)
        hf_style = StandardBert(weights, geometry, hf_style=True)(ids, torch.ones_like(ids))
    assert plain.abs().max() > 1e-3  # a head that is not zero: the comparisons below can fail
    assert_close(hf_style, plain)
    graphs, fused = standard_export.standard_exports(bert, tmp_path, log=lambda _: None)
    assert fused.get("Attention") == CONFIG["num_hidden_layers"]  # the optimizer fused the attention
    import onnxruntime

    for name in ("plain fp32", "fused fp32"):
        session = onnxruntime.InferenceSession(str(graphs[name]), providers=["CPUExecutionProvider"])
        feeds = {i.name: (ids if i.name == "ids" else torch.ones_like(ids)).numpy() for i in session.get_inputs()}
        assert_close(session.run(None, feeds)[0], plain.numpy(), rtol=1e-4)


def test_the_study_times_every_graph_both_ways_and_reports_its_figures(bert, tmp_path):
    # the "project" export: the plain standard ones under the project's file names
    (tmp_path / "standard").mkdir()
    graphs, _ = standard_export.standard_exports(bert, tmp_path / "standard", log=lambda _: None)
    export = tmp_path / "export"
    export.mkdir()
    shutil.copy(graphs["plain fp32"], export / "model.onnx")
    shutil.copy(graphs["plain int8 per-tensor"], export / "model.int8.onnx")
    study = standard_export_study(export, bert, threads=1, rounds=1, log=lambda _: None)
    assert [(s["batch"], s["pieces"]) for s in study["times"]] == list(standard_export.SHAPES)
    names = {"project fp32", "project int8", "plain fp32", "fused fp32", "plain int8 per-tensor",
             "plain int8 per-channel", "fused int8 per-tensor", "fused int8 per-channel"}
    for shape in study["times"]:
        assert set(shape["ms"]) == {f"{n} | {kind}" for n in names for kind in SESSIONS}
        assert all(np.isfinite(ms) and ms > 0 for ms in shape["ms"].values())
    for row, shape in zip(ratios(study, "int8"), study["times"]):
        best = min(v for k, v in shape["ms"].items() if k.endswith("| default") and "int8" in k
                   and not k.startswith("project"))
        assert row["against default"]["ratio"] == pytest.approx(shape["ms"]["project int8 | budget_serve"] / best)
    assert [r["batch"] for r in study["skip_layer_norm"]] == [1, 1, 32]
    text = report(study)
    assert "| project int8 |" in text and "SkipLayerNormalization" in text
