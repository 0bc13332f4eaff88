"""ToolFace: real MiniLM retrieval over a real catalog, persisted and rebuilt only on change."""

import pytest

from heart.environments import load_environment
from heart.embeddings import Embedder
from heart.toolface import Tool, ToolFace, ToolSpec


def noop(**kwargs):
    return kwargs


@pytest.fixture(scope="module")
def bfcl_tools():
    return [Tool(spec, noop) for spec in load_environment("bfcl").catalog()]


def test_retrieves_the_right_tool_for_bfcl_requests(bfcl_tools, tmp_path):
    from heart.toolface import RetrievalConfig

    toolface = ToolFace(bfcl_tools, cache_dir=tmp_path, config=RetrievalConfig(min_shown=0))
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
    from heart.toolface import RetrievalConfig

    face = ToolFace(bfcl_tools, cache_dir=tmp_path, config=RetrievalConfig(min_shown=0))
    hits = face.retrieve("list the files here", k=3)
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


# -- own descriptions: what the Planner reads ------------------------------------------------
def test_short_description_is_the_tools_own_first_sentence(bfcl_tools):
    by_name = {t.name: t.spec for t in bfcl_tools}
    cp = by_name["cp"]
    assert cp.description.startswith("This tool belongs to the Gorilla file system.")
    assert cp.short_description() == "Copy a file or directory from one location to another."
    assert "Gorilla" not in cp.index_text() and cp.index_text().startswith("cp: Copy a file")
    assert by_name["lockDoors"].index_text().startswith("lock doors: Locks the doors")
    agentdojo = ToolSpec("get_unread_emails", "Returns all the unread emails in the inbox. Each email "
                         "has a sender, a subject, and a body.\nThe emails are marked as read.", {})
    assert agentdojo.short_description() == "Returns all the unread emails in the inbox."
    # A parameter's allowed values are indexed as words: "fuel level" finds displayCarStatus.
    status = by_name["displayCarStatus"].index_text()
    assert "option: The option to display. (fuel, battery, doors" in status and "parking brake" in status
    assert "[Enum]" not in status
    # Descriptions that shared a class preamble are now told apart.
    lines = [t.spec.short_description() for t in bfcl_tools if t.spec.category == "GorillaFileSystem"]
    assert len(set(lines)) == len(lines) and not any("This tool belongs" in line for line in lines)


def test_planner_input_on_a_bfcl_task_shows_each_tools_own_description(tmp_path):
    """The Planner's available_tools exactly as the loop builds them for a BFCL session."""
    from fakes import HashingEmbedder, Script

    from heart.calls import EpisodeContext, RoleClient
    from heart.loop import HeartLoop, LoopConfig
    from heart.runtime import ScriptedBackend

    env = load_environment("bfcl")
    task = env.load_task("multi_turn_base_0")
    session = env.start(task)
    toolface = ToolFace(session.tools, cache_dir=tmp_path, embedder=HashingEmbedder())
    # A malformed plan is a recorded failure: the test needs only what the Planner was shown.
    script = Script(planner=["not a plan"])
    client = RoleClient(ScriptedBackend(script), EpisodeContext("ep", task.task_id, "bfcl"), None)
    HeartLoop(client, toolface, session.clarify, LoopConfig(replan_budget=0)).solve(task.turns[0])
    grouped = next(payload for role, payload in script.calls if role == "planner")["available_tools"]
    # {category: {tool name: its own one-line description}} — names, never schemas; the Code
    # family's primitive is always shown beside the tools and is not a ToolFace document
    from heart.families import CODE_CATEGORY, CODE_PRIMITIVE

    assert list(grouped.pop(CODE_CATEGORY)) == [CODE_PRIMITIVE]
    shown = [(category, name, line) for category, tools in grouped.items() for name, line in tools.items()]
    assert len(shown) >= 5
    for category, name, line in shown:
        spec = toolface.get(name).spec
        own = spec.description.split("Tool description:", 1)[1].strip()
        assert own.startswith(line.rstrip("…")) and "This tool belongs" not in line
        assert isinstance(line, str)  # a line of text, never a schema
        assert category == spec.category and category in task.meta["involved_classes"]
    assert len({line for _, _, line in shown}) == len(shown)


# -- hybrid retrieval, companions, index kinds -------------------------------------------
def spec(name, description, **props):
    return ToolSpec(name, description, {"type": "object", "properties": {p: {"type": "string", "description": d}
                                                                          for p, d in props.items()}})


SMALL = [
    spec("startEngine", "Starts the engine of the vehicle.", ignitionMode="START or STOP."),
    spec("pressBrakePedal", "Presses the brake pedal.", pedalPosition="Between 0 and 1."),
    spec("lockDoors", "Locks the doors of the vehicle.", door="Which doors."),
    spec("setHeadlights", "Sets the headlights.", mode="on, off or auto."),
    spec("fillFuelTank", "Fills the fuel tank.", fuelAmount="Gallons to add."),
    spec("get_stock_info", "Get the details of a stock.", symbol="Stock symbol."),
]


def small_face(tmp_path, **config):
    from fakes import HashingEmbedder

    from heart.toolface import RetrievalConfig

    companions = {"startEngine": ["pressBrakePedal", "lockDoors", "not_in_this_catalog"]}
    config.setdefault("min_shown", 0)
    return ToolFace([Tool(s, noop) for s in SMALL], cache_dir=tmp_path, embedder=HashingEmbedder(),
                    config=RetrievalConfig(**config), companions=companions)


def test_companions_follow_the_ranked_tools_once_each(tmp_path):
    face = small_face(tmp_path, k=1)
    hits = face.retrieve("please start the engine")
    assert [h.name for h in hits] == ["startEngine", "pressBrakePedal", "lockDoors"]
    assert hits[0].score > 0 and hits[1].score == hits[2].score == 0.0
    # k=2 ranks lockDoors itself: it is not repeated as a companion
    names = [h.name for h in small_face(tmp_path, k=3).retrieve("start the engine and lock the doors")]
    assert len(names) == len(set(names)) and {"startEngine", "lockDoors", "pressBrakePedal"} <= set(names)
    assert [h.name for h in small_face(tmp_path, k=1, expand_companions=False).retrieve("start the engine")] == ["startEngine"]


def test_next_ranked_tools_fill_the_list_up_to_min_shown(tmp_path):
    hits = small_face(tmp_path, k=1, min_shown=4).retrieve("please start the engine")
    assert [h.name for h in hits][:3] == ["startEngine", "pressBrakePedal", "lockDoors"] and len(hits) == 4
    assert len(small_face(tmp_path, k=1, min_shown=2).retrieve("please start the engine")) == 3
    assert len(small_face(tmp_path, k=2, min_shown=50).retrieve("anything")) == len(SMALL)


def test_variants_of_one_function_are_shown_once(tmp_path):
    from fakes import HashingEmbedder

    from heart.toolface import RetrievalConfig

    variants = [spec("find_restaurants", "Find restaurants in a city."),
                spec("find_restaurants~a1b2c3", "Find restaurants in a city by cuisine."),
                spec("book_table", "Book a table at a restaurant.")]
    tools = [Tool(s, noop) for s in variants]
    collapsed = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), config=RetrievalConfig(min_shown=0))
    names = [n for n, _ in collapsed.search("find restaurants in a city", 3)]
    assert len(names) == 2 and "book_table" in names
    every = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(),
                     config=RetrievalConfig(min_shown=0, collapse_variants=False))
    assert len(every.search("find restaurants in a city", 3)) == 3


def test_lexical_scoring_finds_words_of_a_tool_name(tmp_path):
    # BM25 alone (dense weight 0) matches the user's words against the name split into words.
    hits = small_face(tmp_path, k=1, dense_weight=0.0).retrieve("what are the stock details for NVDA")
    assert hits[0].name == "get_stock_info"


def test_hnsw_and_exact_indexes_agree_on_a_small_catalog(tmp_path):
    exact = small_face(tmp_path, index="flat")
    approx = small_face(tmp_path, index="hnsw")
    auto = small_face(tmp_path, exact_max=3)
    assert (exact.index_kind(), approx.index_kind(), auto.index_kind()) == ("flat", "hnsw", "hnsw")
    assert exact.index_path() != approx.index_path()
    for query in ("lock the doors", "fill up the tank", "headlights on"):
        # On a catalog this small HNSW visits every node: same tools, same scores.
        assert [n for n, _ in exact.search(query, 3)] == [n for n, _ in approx.search(query, 3)]
        assert [s for _, s in exact.search(query, 3)] == pytest.approx([s for _, s in approx.search(query, 3)])


def test_a_logged_request_like_the_query_votes_for_the_tools_it_needed(tmp_path):
    from fakes import HashingEmbedder

    from heart.toolface import RetrievalConfig

    tools = [Tool(s, noop) for s in SMALL]
    query = "how much gas is left"  # no tool's text shares a word with it
    log = [("how much gas is left in my car", {"fillFuelTank"}),
           ("how much gas is left in the tank", {"fillFuelTank", "lockDoors"}),
           ("what is the weather like", {"not_in_this_catalog"})]
    plain = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), config=RetrievalConfig(min_shown=0))
    assert plain.search(query, 1)[0][0] != "fillFuelTank"
    face = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), query_log=log,
                    config=RetrievalConfig(min_shown=0, query_log_weight=0.5))
    ranked = [n for n, _ in face.search(query, 3)]
    # both similar requests vote for fillFuelTank, one for lockDoors; the weather one is too far
    assert ranked[:2] == ["fillFuelTank", "lockDoors"]
    far = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), query_log=log,
                   config=RetrievalConfig(min_shown=0, query_log_weight=0.5, query_log_min_similarity=0.99))
    assert far.search(query, 1)[0][0] != "fillFuelTank"  # no logged request is similar enough


def test_the_usage_prior_breaks_ties_toward_often_used_tools(tmp_path):
    from fakes import HashingEmbedder

    from heart.toolface import RetrievalConfig

    tools = [Tool(s, noop) for s in SMALL]
    usage = {"setHeadlights": 0.9}
    face = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), usage=usage,
                    config=RetrievalConfig(min_shown=0, usage_weight=0.2))
    assert face.search("zzz unrelated words", 1)[0][0] == "setHeadlights"
    off = ToolFace(tools, cache_dir=tmp_path, embedder=HashingEmbedder(), usage=usage,
                   config=RetrievalConfig(min_shown=0))
    assert all(score == 0 for _, score in off.search("zzz unrelated words", 6))


def test_the_index_is_keyed_by_what_gets_indexed(tmp_path, monkeypatch):
    face = small_face(tmp_path)
    before = face.index_path()
    monkeypatch.setattr(ToolSpec, "index_text", lambda self: f"changed {self.name}")
    assert small_face(tmp_path).index_path() != before


def test_retrieval_config_rejects_bad_values():
    from heart.toolface import RetrievalConfig

    with pytest.raises(ValueError, match="query_log_weight"):
        RetrievalConfig(query_log_weight=-1)
    with pytest.raises(ValueError, match="query_log_neighbours"):
        RetrievalConfig(query_log_neighbours=0)
    with pytest.raises(ValueError, match="dense_weight"):
        RetrievalConfig(dense_weight=1.5)
    with pytest.raises(ValueError, match="index"):
        RetrievalConfig(index="ivf")
    with pytest.raises(ValueError, match="k must be"):
        RetrievalConfig(k=0)


# -- cache writes under concurrency ---------------------------------------------------------
def test_threads_on_a_cold_cache_embed_a_shared_text_once(tmp_path, monkeypatch):
    """Every thread embeds the same text into an empty cache at once, as concurrent episodes
    do with the query log and a shared class's tools. The text is encoded once and written
    once: the others find it in memory after waiting for the lock (before, each thread
    encoded it again, and with pid-only temp names threads clobbered each other's temp file)."""
    import threading

    import numpy as np

    import heart.embeddings as embeddings_module

    encoded = []

    class Model:
        def encode(self, texts, **kwargs):
            encoded.append(list(texts))
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    monkeypatch.setattr(embeddings_module, "load_embedder", lambda: Model())
    barrier = threading.Barrier(4, timeout=5)
    embedder = Embedder(tmp_path)
    errors, results = [], []

    def work():
        try:
            barrier.wait()  # all four ask before any has an answer
            results.append(embedder.embed(["one tool text"]).tolist())
        except Exception as e:  # noqa: BLE001 - the race shows up as any exception
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and encoded == [["one tool text"]]
    assert results == [[[0.5] * 4]] * 4
    files = sorted(p.name for p in (tmp_path / "embeddings").iterdir())
    assert len(files) == 1 and files[0].endswith(".npy")  # no temp file left behind
    assert np.load(tmp_path / "embeddings" / files[0]).tolist() == [0.5] * 4


def test_embeddings_are_read_from_disk_once_per_process(tmp_path, monkeypatch):
    """Each episode's ToolFace embeds the same query log; the vectors come from memory after
    the first read, and a cache folder's memory is its own (another folder is not served)."""
    import numpy as np

    import heart.embeddings as embeddings_module

    class Model:
        def encode(self, texts, **kwargs):
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    monkeypatch.setattr(embeddings_module, "load_embedder", lambda: Model())
    Embedder(tmp_path / "a").embed(["logged request"])
    loads = []
    real_load = embeddings_module.np.load
    monkeypatch.setattr(embeddings_module.np, "load", lambda *a, **k: loads.append(a[0]) or real_load(*a, **k))
    assert Embedder(tmp_path / "a").embed(["logged request"]).tolist() == [[0.5] * 4]
    assert loads == []
    Embedder(tmp_path / "b").embed(["logged request"])  # another folder: encoded and written there
    assert len(list((tmp_path / "b" / "embeddings").iterdir())) == 1


def test_a_query_is_encoded_with_one_torch_thread_and_the_setting_restored(tmp_path, monkeypatch):
    import numpy as np
    import torch

    import heart.embeddings as embeddings_module

    seen = []

    class Model:
        def encode(self, texts, **kwargs):
            seen.append((len(texts), torch.get_num_threads()))
            return np.ones((len(texts), 4), dtype=np.float32) / 2

    monkeypatch.setattr(embeddings_module, "load_embedder", lambda: Model())
    original = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        embedder = Embedder(tmp_path)
        embedder.embed_query("lock the doors")
        embedder.embed([f"tool {i}" for i in range(10)])
        assert seen == [(1, 1), (10, 2)] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(original)


def test_index_writes_use_unique_temp_names(tmp_path):
    from heart.atomic import temp_path

    target = tmp_path / "abc.flat.faiss"
    names = {temp_path(target) for _ in range(100)}
    assert len(names) == 100 and all(p.parent == tmp_path and p.name.startswith(".abc.flat.faiss.") for p in names)
