"""ToolFace: real MiniLM retrieval over a real catalog, persisted and rebuilt only on change."""

import pytest

from heart.environments import load_environment
from heart.toolface import Embedder, Tool, ToolFace, ToolSpec


def noop(**kwargs):
    return kwargs


@pytest.fixture(scope="module")
def bfcl_tools():
    return [Tool(spec, noop) for spec in load_environment("bfcl").catalog()]


def test_retrieves_the_right_tool_for_bfcl_requests(bfcl_tools, tmp_path):
    toolface = ToolFace(bfcl_tools, cache_dir=tmp_path)
    cases = {
        "Move the file report.pdf into the archive folder": "mv",
        "Post a tweet about my new project": "post_tweet",
        "Book a flight from SFO to LAX next Monday": "book_flight",
        "What is the square root of 144?": "square_root",
        "Lock all the doors of my car": "lockDoors",
        "Buy 100 shares of AAPL": "place_order",
    }
    for query, tool in cases.items():
        names = [t.name for t in toolface.retrieve(query, k=5)]
        assert tool in names, f"{query!r} → {names}"


def test_retrieval_shows_names_and_short_descriptions_only(bfcl_tools, tmp_path):
    hits = ToolFace(bfcl_tools, cache_dir=tmp_path).retrieve("list the files here", k=3)
    assert len(hits) == 3 and hits[0].score >= hits[1].score >= hits[2].score
    assert all(len(h.description) <= 160 and "properties" not in h.description for h in hits)


def test_index_is_persisted_and_rebuilt_only_when_the_catalog_changes(bfcl_tools, tmp_path, monkeypatch):
    first = ToolFace(bfcl_tools[:20], cache_dir=tmp_path)
    first.build_index()
    path = first.index_path()
    assert path.exists()

    embedded = []
    original = Embedder.embed
    monkeypatch.setattr(Embedder, "embed", lambda self, texts: embedded.append(len(texts)) or original(self, texts))
    again = ToolFace(bfcl_tools[:20], cache_dir=tmp_path)
    again.build_index()
    assert again.index_path() == path and embedded == []  # loaded from disk, nothing embedded

    changed = ToolFace(bfcl_tools[:21], cache_dir=tmp_path)
    changed.build_index()
    assert changed.index_path() != path and embedded == [21]  # new catalog, cached vectors reused
    assert changed.retrieve(bfcl_tools[20].spec.description, k=1)[0].name == bfcl_tools[20].name


def test_registry_rejects_duplicates_and_unknown_names(tmp_path):
    spec = ToolSpec("ls", "List files.", {"type": "object", "properties": {}})
    toolface = ToolFace([Tool(spec, noop)], cache_dir=tmp_path)
    with pytest.raises(ValueError, match="already registered"):
        toolface.register(Tool(spec, noop))
    with pytest.raises(KeyError, match="no tool named 'rm'"):
        toolface.get("rm")
